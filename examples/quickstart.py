import gymnasium as gym

import flexibuff_envs as fe

env = fe.record(gym.make("CartPole-v1"), num_steps=100_000, gamma=0.99, log="cartpole.log")
obs, info = env.reset(seed=0)
for _ in range(10_000):
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    if terminated or truncated:
        obs, info = env.reset()
env.close()  # every ended episode is in cartpole.log, synced

buffer = env.buffer
batch = buffer.sample_transitions(256)  # DQN: batch.obs, batch.obs_, ... (as_torch=True for tensors)
episodes = buffer.sample_episodes(max_batch_size=1024)  # REINFORCE: each episode's G
for minibatch in buffer.minibatches(64):  # one pass over every row
    pass
buffer.save("cartpole.fbuf")  # one file, checksummed, no pickle
logged = fe.FlexibleBuffer.open("cartpole.log")  # a log sampled in place, however large
print(f"{len(buffer)} rows, {buffer.n_episodes} episodes; the log holds {logged.n_episodes}")
