"""The ring, the episode index and sampling."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing.reference import plain_returns, play
from tests.envs import ToyEnv

GAMMA = 0.8


def expected_live_episodes(
    episodes: list[tuple[int, int]], running: tuple[int, int] | None, capacity: int
) -> tuple[list[tuple[int, int]], int]:
    """The newest whole episodes that fit beside the running one, and the first live step."""
    used = 0 if running is None else min(running[1] - running[0], capacity)
    first = None if running is None else running[1] - used
    kept: list[tuple[int, int]] = []
    for start, end in reversed(episodes):
        if used + end - start > capacity:
            break
        used += end - start
        kept.insert(0, (start, end))
        first = start
    return kept, int(first if first is not None else 0)


@pytest.mark.parametrize(
    ("lengths", "capacity", "steps"),
    [((1, 7, 2, 30, 3, 11), 37, 400), ((50, 2, 3), 37, 300), ((4,), 4, 50), ((9, 1), 64, 64)],
)
def test_ring_forgets_oldest_episodes_whole(lengths: tuple[int, ...], capacity: int, steps: int) -> None:
    reference = play(ToyEnv(lengths=lengths), seed=1, steps=steps)
    env = fe.record(ToyEnv(lengths=lengths), num_steps=capacity, gamma=GAMMA)
    play(env, seed=1, steps=steps, actions=reference.actions)
    ended_at = reference.episodes[-1][1] if reference.episodes else 0
    running = (ended_at, steps) if ended_at < steps else None
    kept, first = expected_live_episodes(reference.episodes, running, capacity)
    buffer = env.buffer
    assert len(buffer) == steps - first
    assert buffer.n_episodes == len(kept)
    # every live row holds exactly its step, with G of ended episodes and NaN while running
    G = reference.G(GAMMA)
    live = np.arange(first, steps)
    batch = buffer.sample_transitions(idx=live % capacity)
    np.testing.assert_array_equal(batch.obs, np.stack(reference.obs)[live])
    np.testing.assert_array_equal(batch.obs_, np.stack(reference.obs_)[live])
    np.testing.assert_allclose(batch.G, G[live], rtol=1e-5, atol=1e-5)
    # sampled episodes are exactly the kept ones, whole
    episodes = buffer.sample_episodes(n_episodes=len(kept)) if kept else []
    assert [len(e) for e in episodes] == [end - start for start, end in kept]
    for (start, end), episode in zip(kept, episodes):
        np.testing.assert_array_equal(episode.obs, np.stack(reference.obs)[start:end])
        np.testing.assert_allclose(episode.G, plain_returns(reference.reward[start:end], GAMMA), rtol=1e-5)
    # uniform draws only ever hit live rows
    drawn = buffer.sample_transitions(2000).idx
    assert set(np.unique(drawn)) <= set(live % capacity)


def test_episode_longer_than_the_ring_is_never_handed_out_whole() -> None:
    env = fe.record(ToyEnv(lengths=(100,)), num_steps=30)
    env.reset(seed=0)
    for _ in range(100):
        env.step(0)
    env.reset()
    assert len(env.buffer) == 30
    assert env.buffer.n_episodes == 0
    with pytest.raises(fe.EmptyBufferError, match="asked for 1 whole episodes but the buffer holds 0"):
        env.buffer.sample_episodes(n_episodes=1)
    # its transitions are still there, with the right G for the steps kept
    assert not np.isnan(env.buffer.sample_transitions(100).G).any()


def recorded(steps: int = 120, **kwargs) -> fe.FlexibleBuffer:
    env = fe.record(ToyEnv(lengths=(5, 9, 3)), num_steps=1000, **kwargs)
    play(env, seed=2, steps=steps)
    return env.buffer


def test_sample_shapes_drop_the_agent_axis_for_one_agent() -> None:
    batch = recorded().sample_transitions(32)
    assert batch.obs.shape == (32, 3) and batch.obs_.shape == (32, 3)
    assert batch.discrete_actions.shape == (32, 1) and batch.discrete_actions.dtype == np.int64
    assert batch.individual_rewards.shape == (32,) and batch.global_rewards.shape == (32,)
    assert batch.terminated.dtype == bool and batch.G.shape == (32,)
    assert batch.continuous_actions is None and batch.state is None and batch.discrete_log_probs is None


def test_multi_agent_rows_are_agent_major_like_flexibuff() -> None:
    buffer = fe.FlexibleBuffer(8, 2, [3], n_agents=2, individual_reward=True, state_size=4)
    buffer.begin_episode()
    for step in range(3):
        row = buffer.claim_row()
        buffer.field("obs")[:, row] = [[step, 0], [step, 1]]
        buffer.field("individual_rewards")[:, row] = [1.0, 2.0]
        buffer.field("active")[:, row] = True
    buffer.end_episode()
    batch = buffer.sample_transitions(idx=np.arange(3))
    assert batch.obs.shape == (2, 3, 2) and batch.state.shape == (3, 4)
    assert batch.obs[1, 2].tolist() == [2, 1]
    np.testing.assert_allclose(batch.G[1], [2 + 2 * 0.99 + 2 * 0.99**2, 2 + 2 * 0.99, 2])


def test_weighted_sampling_follows_unnormalised_weights() -> None:
    buffer = recorded()
    rows = np.arange(len(buffer))
    buffer.set_memory_weights(rows, 0.0)
    buffer.set_memory_weights(np.array([7, 40]), np.array([30.0, 10.0]))
    drawn = buffer.sample_transitions(4000, weighted=True).idx
    assert set(np.unique(drawn)) == {7, 40}
    assert 0.70 < np.mean(drawn == 7) < 0.80
    buffer.set_memory_weights(rows, 0.0)
    with pytest.raises(ValueError, match="memory_weights"):
        buffer.sample_transitions(4, weighted=True)


def test_minibatches_visit_every_live_row_once() -> None:
    buffer = recorded(steps=103)
    batches = list(buffer.minibatches(16))
    assert [len(b) for b in batches] == [16] * 6 + [7]
    assert sorted(np.concatenate([b.idx for b in batches]).tolist()) == list(range(103))
    assert [len(b) for b in buffer.minibatches(16, drop_last=True)] == [16] * 6


def test_sample_episodes_fit_the_batch_and_come_in_recording_order() -> None:
    buffer = recorded(steps=170)  # episodes of 5, 9, 3 steps
    for _ in range(20):
        episodes = buffer.sample_episodes(max_batch_size=20)
        assert 1 <= len(episodes) and sum(len(e) for e in episodes) <= 20
        firsts = [int(e.idx[0]) for e in episodes]
        assert firsts == sorted(firsts)
        for episode in episodes:
            assert np.all(np.diff(episode.idx) == 1)
            assert episode.terminated[-1] and not episode.terminated[:-1].any()


def test_torch_batches_follow_flexibuff_dtypes() -> None:
    torch = pytest.importorskip("torch")
    buffer = recorded()
    batch = buffer.sample_transitions(8, as_torch=True, device="cpu")
    assert batch.obs.dtype == torch.float32 and batch.discrete_actions.dtype == torch.int64
    assert batch.terminated.dtype == torch.float32 and batch.G.dtype == torch.float32
    (episode,) = buffer.sample_episodes(n_episodes=1, as_torch=True)
    assert isinstance(episode.obs, torch.Tensor)


def test_torch_image_batches_stay_one_byte_per_value() -> None:
    torch = pytest.importorskip("torch")
    env = fe.record(gym.make("CarRacing-v3", max_episode_steps=5), num_steps=20)
    env.reset(seed=0)
    for _ in range(6):
        env.step(env.action_space.sample())
    batch = env.buffer.sample_transitions(4, as_torch=True)
    assert batch.obs.dtype == batch.obs_.dtype == torch.uint8 and batch.obs.shape == (4, 96 * 96 * 3)
    assert batch.continuous_actions.dtype == batch.terminated.dtype == torch.float32


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = recorded()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(
        fe.MissingExtraError, match=r"pip install -e '\.\[torch\]' in a clone of flexibuff_envs, or pip install 'torch'"
    ):
        buffer.sample_transitions(4, as_torch=True)


def test_empty_buffer_errors_are_clear() -> None:
    buffer = fe.FlexibleBuffer(10, 3, [2])
    with pytest.raises(fe.EmptyBufferError, match="sample_transitions: the buffer holds no rows"):
        buffer.sample_transitions(4)
    with pytest.raises(fe.EmptyBufferError, match="sample_episodes"):
        buffer.sample_episodes()
    with pytest.raises(fe.EmptyBufferError, match="minibatches"):
        next(buffer.minibatches(4))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_steps": 0}, "num_steps"),
        ({"obs_size": -1}, "obs_size"),
        ({"gamma": 1.2}, "gamma"),
        ({"n_agents": 0}, "n_agents"),
        ({"discrete_action_cardinalities": [2, 0]}, "cardinalities"),
    ],
)
def test_invalid_constructor_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        fe.FlexibleBuffer(**{"num_steps": 5, "obs_size": 2, **kwargs})


def test_flexibuff_keywords_and_spelling_are_accepted() -> None:
    buffer = fe.FlexibleBuffer(
        num_steps=5,
        obs_size=2,
        action_mask=[True],
        discrete_action_cardinalities=[4],
        continious_action_dimension=3,
        n_agents=2,
        global_reward=True,
        global_auxiliary_reward=True,
        individual_reward=True,
        individual_auxiliary_reward=True,
        log_prob_discrete=True,
        log_prob_continuous=2,
        memory_weights=True,
        path="/tmp/",
        name="fb",
    )
    assert buffer.spec.continuous_action_dimension == 3 and buffer.spec.action_mask
    assert buffer.field("continuous_log_probs").shape == (2, 5, 2)
    assert buffer.field("discrete_log_probs").shape == (2, 5, 1)


def test_finish_path_bootstraps_running_episodes_at_a_rollout_cut() -> None:
    env = fe.record(ToyEnv(lengths=(50,)), num_steps=100, gamma=0.5)
    env.reset(seed=0)
    for _ in range(4):
        env.step(1)
    batch = env.buffer.sample_transitions(idx=np.arange(4))
    assert np.isnan(batch.G).all()
    env.buffer.finish_path(last_values=8.0)
    rewards = batch.individual_rewards.tolist()
    np.testing.assert_allclose(
        env.buffer.sample_transitions(idx=np.arange(4)).G, plain_returns(rewards, 0.5, 8.0), rtol=1e-5
    )


def test_hand_filled_buffer_with_team_reward_only_gets_G_from_it() -> None:
    buffer = fe.FlexibleBuffer(10, 1, [2], global_reward=True, gamma=0.5)
    buffer.begin_episode()
    for _ in range(3):
        buffer.field("global_rewards")[buffer.claim_row()] = 1.0
    buffer.end_episode()
    np.testing.assert_allclose(buffer.sample_transitions(idx=np.arange(3)).G, [1.75, 1.5, 1.0])


def test_sequences_stay_inside_one_episode_with_a_validity_mask() -> None:
    reference = play(ToyEnv(lengths=(3, 8, 5)), seed=4, steps=90)
    env = fe.record(ToyEnv(lengths=(3, 8, 5)), num_steps=40)  # the ring wraps: positions matter
    play(env, seed=4, steps=90, actions=reference.actions)
    batch = env.buffer.sample_sequences(300, 6)
    assert batch.obs.shape == (300, 6, 3) and batch.valid.shape == (300, 6)
    obs = np.stack(reference.obs)
    step_of = {tuple(o): t for t, o in enumerate(obs)}  # random observations identify their step
    episode_of = np.zeros(len(obs), dtype=int)
    for e, (start, end) in enumerate(reference.episodes + [(reference.episodes[-1][1], 90)]):
        episode_of[start:end] = e
    for window, valid in zip(batch.obs, batch.valid):
        steps = [step_of[tuple(o)] for o in window]
        n = int(valid.sum())
        assert valid[:n].all() and not valid[n:].any()  # valid is a prefix
        assert steps[:n] == list(range(steps[0], steps[0] + n))  # consecutive steps
        assert len({episode_of[t] for t in steps[:n]}) == 1  # one episode
        last = steps[n - 1]
        assert n == 6 or last + 1 == len(obs) or episode_of[last + 1] != episode_of[last]


def test_clear_starts_an_empty_rollout_while_the_running_episode_goes_on() -> None:
    env = fe.record(ToyEnv(lengths=(6,)), num_steps=20, gamma=0.5)
    env.reset(seed=0)
    for _ in range(8):  # one whole episode and 2 steps of the next
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    env.buffer.clear()
    assert len(env.buffer) == 0 and env.buffer.n_episodes == 0
    for _ in range(4):  # the running episode ends after 4 more steps
        env.step(0)
    assert len(env.buffer) == 4 and env.buffer.n_episodes == 0  # not whole: never handed out
    (batch,) = env.buffer.minibatches(4, shuffle=False)  # the rows after the clear, in order
    assert batch.idx.tolist() == [8, 9, 10, 11] and batch.terminated[-1]
    np.testing.assert_allclose(batch.G, plain_returns(batch.individual_rewards.tolist(), 0.5), rtol=1e-5)


def test_fields_lists_what_the_buffer_holds() -> None:
    buffer = fe.FlexibleBuffer(num_steps=4, obs_size=2, discrete_action_cardinalities=[3], individual_reward=True)
    assert buffer.fields == (
        "G",
        "active",
        "discrete_actions",
        "individual_rewards",
        "obs",
        "obs_",
        "terminated",
        "truncated",
    )
    buffer.field("values")  # a field allocated on first use is listed from then on
    assert "values" in buffer.fields and "continuous_actions" not in buffer.fields


def test_a_mask_asked_for_by_hand_comes_with_its_next_masks(tmp_path: Path) -> None:
    buffer = fe.FlexibleBuffer(10, 3, [2])  # made without masks
    buffer.field("action_mask")[0, 0] = 1  # FlexiBuff style: only the first action legal
    buffer.begin_episode()
    buffer.claim_row()
    buffer.end_episode()
    batch = fe.FlexibleBuffer.load(buffer.save(tmp_path / "masks.fbuf")).sample_transitions(idx=np.array([0]))
    assert batch.action_mask[0].tolist() == [[True, False]] and batch.action_mask_[0].shape == (1, 2)


def test_episodes_iterates_every_whole_episode_in_recording_order() -> None:
    envs = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=300)
    envs.reset(seed=0)
    for t in range(400):  # the ring wraps: the oldest episodes are forgotten whole
        envs.step(np.array([t % 2, (t // 3) % 2]))
    episodes = list(envs.buffer.episodes())
    assert len(episodes) == envs.buffer.n_episodes > 0
    lanes = [int(e.idx[0]) // 300 for e in episodes]
    assert lanes == sorted(lanes)  # lane by lane
    for e in episodes:  # each whole, in time order, ended at its last row only
        assert (np.diff(e.idx) % 300 == 1).all() and (e.terminated | e.truncated)[-1]
        assert not (e.terminated | e.truncated)[:-1].any() and not np.isnan(e.G).any()
    torch = pytest.importorskip("torch")
    assert isinstance(next(envs.buffer.episodes(as_torch=True)).obs, torch.Tensor)


DQN_FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated")


@pytest.mark.parametrize("as_torch", [False, True])
def test_fields_gathers_only_what_is_asked_for(as_torch: bool) -> None:
    if as_torch:
        pytest.importorskip("torch")
    env = fe.record(gym.make("Taxi-v4"), num_steps=500, seed=1)  # category obs, masks
    env.reset(seed=0)
    for t in range(300):
        env.annotate(values=0.5)
        if any(env.step(int(env.action_space.sample()))[2:4]):
            env.reset()
    full = env.buffer.sample_transitions(idx=np.arange(200))
    few = env.buffer.sample_transitions(idx=np.arange(200), fields=DQN_FIELDS, as_torch=as_torch)
    for name in fe.FlexibleBuffer(1, 1).fields + ("action_mask", "action_mask_", "values", "G", "state"):
        if name in DQN_FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(few, name)), getattr(full, name))
        else:
            assert getattr(few, name) is None, name
    masks = env.buffer.sample_transitions(idx=np.arange(5), fields=["action_mask_"])
    np.testing.assert_array_equal(masks.action_mask_[0], full.action_mask_[0][:5])
    (batch,) = env.buffer.minibatches(1000, shuffle=False, fields=["values"])
    assert batch.obs is None and len(batch.values) == len(env.buffer)
    with pytest.raises(ValueError, match="rewards"):
        env.buffer.sample_transitions(4, fields=["rewards"])
    with pytest.raises(TypeError, match="string"):
        env.buffer.sample_transitions(4, fields="obs")


def test_a_sampling_mode_is_one_class_drawn_through_draw() -> None:
    """A sampler of one's own (here: each lane's newest rows) gives batches like the built-in
    modes from the live rows alone (no ring arithmetic), and the built-in methods are `draw`
    with theirs."""
    from flexibuff_envs.sampling.samplers import Draw, Live, Minibatches, Uniform

    class Newest:
        def __init__(self, n: int) -> None:
            self.n = n

        def draws(self, live: Live, rng: np.random.Generator) -> list[Draw]:
            self.seen = live.size  # the live rows it drew from
            return [Draw(rows[: -self.n - 1 : -1]) for rows in live.by_lane()]

    envs = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=100)
    envs.reset(seed=0)
    for _ in range(30):
        envs.step(np.array([0, 1]))
    rows = np.concatenate([b.idx for b in envs.buffer.draw(Minibatches(7, shuffle=False))])
    assert len(rows) == len(envs.buffer) and (np.diff(rows[rows < 100]) == 1).all()  # every row, in order
    sampler = Newest(3)
    newest = list(envs.buffer.draw(sampler, fields=("obs", "terminated")))
    assert sampler.seen == len(envs.buffer) == sum(rows.size for rows in envs.buffer._live().by_lane())
    assert [b.idx.tolist() for b in newest] == [rows[rows < 100][:-4:-1].tolist(), rows[rows >= 100][:-4:-1].tolist()]
    assert newest[0].obs.shape == (3, 4) and newest[0].G is None
    stepped = list(envs.buffer.draw(Newest(3), n_step=3))  # n-step windows for a sampler of one's own
    assert [b.idx.tolist() for b in stepped] == [b.idx.tolist() for b in newest]
    assert all(b.discounts is not None and b.discounts.shape == (3,) for b in stepped)
    envs.buffer.rng = np.random.default_rng(5)
    one = envs.buffer.sample_transitions(16)
    envs.buffer.rng = np.random.default_rng(5)
    np.testing.assert_array_equal(next(envs.buffer.draw(Uniform(16))).idx, one.idx)
    # n-step returns are a read-side step any sampler's rows can take, as sample_transitions' do
    envs.buffer.rng = np.random.default_rng(5)
    three = envs.buffer.sample_transitions(16, n_step=3)
    envs.buffer.rng = np.random.default_rng(5)
    (drawn,) = envs.buffer.draw(Uniform(16), n_step=3)
    for name in ("idx", "individual_rewards", "discounts", "obs_", "terminated"):
        np.testing.assert_array_equal(getattr(drawn, name), getattr(three, name))
    assert not np.array_equal(three.individual_rewards, one.individual_rewards)  # summed over 3 steps


def test_uniform_draws_cover_the_live_rows_evenly_and_nothing_else() -> None:
    """Across lanes of different sizes (one empty) and a wrapped ring, each live row is drawn
    about as often as any other, and no other row ever."""
    buffer = fe.FlexibleBuffer(10, 1, n_envs=4, seed=0)
    for lane, steps in ((0, 14), (2, 3), (3, 7)):  # lane 0 wraps: its oldest rows are gone; lane 1 is empty
        for start in range(0, steps, 7):
            buffer.begin_episode(lane)
            for _ in range(min(7, steps - start)):
                buffer.claim_row(lane)
            buffer.end_episode(lane)
    live = np.sort(np.concatenate([b.idx for b in buffer.minibatches(100, shuffle=False)]))
    drawn = buffer.sample_transitions(200_000).idx
    assert set(np.unique(drawn)) == set(live)
    counts = np.bincount(drawn, minlength=40)[live]
    expected = drawn.size / live.size
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 2 * (live.size - 1) + 30  # far below: a row drawn twice as often would add thousands


def test_claim_rows_hands_out_the_rows_claim_row_does_one_by_one() -> None:
    """Across a wrapped ring and an episode longer than the lane: the same rows, the same episodes
    forgotten, the same running episode clipped."""
    one_by_one, at_once = (fe.FlexibleBuffer(10, 1, n_envs=2, seed=0) for _ in range(2))
    for steps in (4, 5, 7, 23, 0, 3):
        one_by_one.begin_episode(1)
        at_once.begin_episode(1)
        expected = [one_by_one.claim_row(1) for _ in range(steps)]
        np.testing.assert_array_equal(at_once.claim_rows(steps, lane=1), expected)
        assert at_once.claim_rows(0, lane=1).size == 0
        one_by_one.end_episode(1)
        at_once.end_episode(1)
        assert [(e.start, e.end, e.whole) for e in at_once._index.read()[1].ended] == [
            (e.start, e.end, e.whole) for e in one_by_one._index.read()[1].ended
        ]
        assert at_once._index.read()[1].live_start == one_by_one._index.read()[1].live_start


def test_a_maddpg_target_from_a_batch_by_agent_is_one_value_per_row() -> None:
    """MADDPG's critic target ``r + (1 - d) * gamma * Q'(s', a')`` (AgileRL's ``learn``) over a
    batch by agent: the critic gives ``[batch, 1]``, and so do the rewards and dones, so the
    target and the loss are per row (with ``[batch]`` rewards it broadcast to ``[batch, batch]``
    and the loss came out silently wrong)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("mpe2")
    from tests.envs import recorded

    batch = recorded("spread").sample_transitions(64, as_torch=True).by_agent()
    torch.manual_seed(0)
    names = list(batch.obs)
    critic = torch.nn.Linear(sum(batch.obs[a].shape[1] + 1 for a in names), 1)
    joint = torch.cat([torch.cat([batch.obs_[a], batch.discrete_actions[a].float()], dim=1) for a in names], dim=1)
    now = torch.cat([torch.cat([batch.obs[a], batch.discrete_actions[a].float()], dim=1) for a in names], dim=1)
    for agent in names:
        reward, done = batch.individual_rewards[agent], batch.terminated[agent]
        target = reward + (1 - done) * 0.95 * critic(joint).detach()
        assert target.shape == (64, 1)
        loss = torch.nn.functional.mse_loss(critic(now), target)
        by_hand = ((critic(now)[:, 0] - (reward[:, 0] + (1 - done[:, 0]) * 0.95 * critic(joint)[:, 0])) ** 2).mean()
        assert torch.isclose(loss, by_hand)


def test_a_batch_by_agent_is_the_agent_axis_keyed_by_the_envs_names_without_copies() -> None:
    """AgileRL's layout (``batch.obs[agent_id]``): each per-agent field a dict in the env's agent
    order, each value that agent's slice of the batch (a view, numpy or torch); per-row fields as
    they are; masks by head; a one-agent batch keyed by its one name."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    from tests.envs import recorded

    names = simple_spread_v3.parallel_env().possible_agents
    buffer = recorded("spread")
    batch = buffer.sample_transitions(64)
    view = batch.by_agent()
    assert list(view.obs) == list(names) and list(view.G) == list(names)
    for k, name in enumerate(names):
        for field in ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "active", "G"):
            mine, whole = getattr(view, field)[name], getattr(batch, field)
            column = field not in ("obs", "obs_", "discrete_actions")  # a value a row: [batch, 1], as AgileRL's
            np.testing.assert_array_equal(mine, whole[k][:, None] if column else whole[k], err_msg=field)
            assert np.shares_memory(mine, whole), field
    assert view.individual_rewards[names[0]].shape == view.terminated[names[0]].shape == (64, 1)
    assert view.state is batch.state and view.global_rewards is batch.global_rewards and view.idx is batch.idx
    tensors = buffer.sample_transitions(64, as_torch=True, device="cpu")
    by_name = tensors.by_agent()
    assert all(by_name.obs[name].data_ptr() == tensors.obs[k].data_ptr() for k, name in enumerate(names))
    sequences, episode = buffer.sample_sequences(4, 5), next(iter(buffer.episodes()))  # every mode carries names
    np.testing.assert_array_equal(sequences.by_agent().obs[names[1]], sequences.obs[1])
    np.testing.assert_array_equal(episode.by_agent().G[names[2]], episode.G[2][:, None])
    n_step = buffer.sample_transitions(8, n_step=3)
    np.testing.assert_array_equal(n_step.by_agent().discounts[names[0]], n_step.discounts[0][:, None])
    masks = recorded("connect_four").sample_transitions(16)
    turns = masks.by_agent()
    for k, name in enumerate(masks.agents):
        np.testing.assert_array_equal(turns.action_mask[name][0], masks.action_mask[0][k])
    single = recorded("cartpole").sample_transitions(8)
    assert list(single.by_agent().obs) == list(single.agents) and single.by_agent().obs[single.agents[0]] is single.obs
    with pytest.raises(KeyError):
        view.obs["nobody"]
    with pytest.raises(fe.InvalidArgumentError, match="no agent names"):
        fe.FlexiBatch(obs=np.zeros((2, 3))).by_agent()
