"""Batches as TorchRL TensorDicts: its losses read them as they read its own collectors' data."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

from torchrl.data import Categorical
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import DQNLoss

import flexibuff_envs as fe
from tests.envs import recorded_spread


def recorded_cartpole(steps: int = 400) -> fe.FlexibleBuffer:
    env = fe.record(gym.make("CartPole-v1"), num_steps=1000)
    env.reset(seed=0)
    for t in range(steps):
        _, _, terminated, truncated, _ = env.step(t % 2)
        if terminated or truncated:
            env.reset()
    return env.buffer


@pytest.mark.parametrize("as_torch", [False, True])
def test_torchrl_s_dqn_loss_reads_a_batch_and_learns_from_it(as_torch: bool) -> None:
    torch.manual_seed(0)
    batch = recorded_cartpole().sample_transitions(64, as_torch=as_torch)
    td = batch.to_tensordict()
    assert td.batch_size == (64,) and td["action"].dtype == torch.int64 and td["next", "terminated"].dtype == torch.bool
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[32]), in_keys=["observation"], spec=Categorical(2)
    )
    loss_module = DQNLoss(actor, action_space="categorical", delay_value=False)
    loss_module.make_value_estimator(gamma=0.9)
    loss = loss_module(td)["loss"]
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())
    with torch.no_grad():  # the same loss by hand from the batch's own fields
        q = actor.module[0](torch.as_tensor(np.asarray(batch.obs, dtype=np.float32)))
        q_next = actor.module[0](torch.as_tensor(np.asarray(batch.obs_, dtype=np.float32))).max(-1).values
        actions = torch.as_tensor(np.asarray(batch.discrete_actions)[:, 0]).long()
        rewards = torch.as_tensor(np.asarray(batch.individual_rewards, dtype=np.float32))
        alive = 1.0 - torch.as_tensor(np.asarray(batch.terminated, dtype=np.float32))
        target = rewards + 0.9 * alive * q_next
        expected = (q.gather(-1, actions[:, None])[:, 0] - target).pow(2).mean()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_agents_are_grouped_as_torchrl_s_multi_agent_envs_lay_them_out() -> None:
    pytest.importorskip("pettingzoo")
    pytest.importorskip("mpe2")
    batch = recorded_spread(max_cycles=10, steps=30).sample_transitions(16)
    td = batch.to_tensordict()
    assert td["agents", "observation"].shape == (16, 3, 18) and td["agents", "action"].shape == (16, 3)
    assert td["next", "agents", "reward"].shape == (16, 3, 1) and td["next", "reward"].shape == (16, 1)
    assert td["next", "done"].shape == (16, 1) and td["state"].shape[0] == 16
    np.testing.assert_array_equal(td["agents", "observation"][:, 1].numpy(), batch.obs[1])
    np.testing.assert_array_equal(td["next", "reward"][:, 0].numpy(), batch.global_rewards)
    np.testing.assert_array_equal(td["next", "done"][:, 0].numpy(), (batch.terminated | batch.truncated).all(0))


def test_action_masks_travel_as_bools_side_by_side() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import connect_four_v3

    env = fe.record(connect_four_v3.env(), num_steps=200)
    env.reset(seed=0)
    for _ in env.agent_iter(40):
        obs, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else int(np.flatnonzero(obs["action_mask"])[0]))
    batch = env.buffer.sample_transitions(8)
    td = batch.to_tensordict()
    assert td["agents", "action_mask"].dtype == torch.bool and td["agents", "action_mask"].shape == (8, 2, 7)
    np.testing.assert_array_equal(td["next", "agents", "action_mask"][:, 0].numpy(), batch.action_mask_[0][0])


def test_fields_of_your_own_travel_under_their_names() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=100, extra_fields={"hidden": (3,), "option": ((), "int64")})
    env.reset(seed=0)
    for t in range(5):
        env.annotate(hidden=np.full(3, t), option=t)
        env.step(0)
    batch = env.buffer.sample_transitions(idx=np.arange(5))
    td = batch.to_tensordict()
    assert td["hidden"].shape == (5, 3) and td["option"].dtype == torch.int64
    np.testing.assert_array_equal(td["hidden"].numpy(), batch.hidden)
    np.testing.assert_array_equal(td["option"].numpy(), np.arange(5))


def test_an_n_step_batch_gives_torchrl_its_steps_and_dqn_loss_discounts_by_them() -> None:
    torch.manual_seed(0)
    env = fe.record(gym.make("CartPole-v1", max_episode_steps=8), num_steps=400, gamma=0.9)
    env.reset(seed=0)
    for t in range(300):
        if any(env.step(t % 2)[2:4]):
            env.reset()
    batch = env.buffer.sample_transitions(64, n_step=3)
    assert set(np.unique(batch.n_steps)) == {1, 2, 3} and batch.n_steps.dtype == np.int64
    np.testing.assert_allclose(batch.discounts, 0.9**batch.n_steps, rtol=1e-6)
    td = batch.to_tensordict()
    assert td["steps_to_next_obs"].shape == (64, 1) and td["steps_to_next_obs"].dtype == torch.int64
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[32]), in_keys=["observation"], spec=Categorical(2)
    )
    loss_module = DQNLoss(actor, action_space="categorical", delay_value=False)
    loss_module.make_value_estimator(gamma=0.9)
    loss = loss_module(td)["loss"]
    with torch.no_grad():  # the n-step target by hand: r + gamma ** k * (1 - terminated) * max Q(obs_)
        q = actor.module[0](torch.as_tensor(batch.obs))
        q_next = actor.module[0](torch.as_tensor(batch.obs_)).max(-1).values
        target = (
            torch.as_tensor(batch.individual_rewards)
            + torch.as_tensor(batch.discounts) * (1.0 - torch.as_tensor(batch.terminated).float()) * q_next
        )
        taken = q.gather(-1, torch.as_tensor(batch.discrete_actions))[:, 0]
        expected = (taken - target).pow(2).mean()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def _ppo_rollout(multi: bool) -> tuple[fe.FlexibleBuffer, Any, Any]:
    """A rollout recorded with a policy's log probs and a critic's values annotated (truncations
    bootstrapped by the critic, the cut closed by `finish_path`): the buffer, the TorchRL actor
    and critic that acted."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    group = ("agents",) if multi else ()
    obs_dim, n_actions = (18, 5) if multi else (4, 2)
    policy = MLP(in_features=obs_dim, out_features=n_actions, num_cells=[16])
    value = MLP(in_features=obs_dim, out_features=1, num_cells=[16])
    actor = ProbabilisticActor(
        TensorDictModule(policy, in_keys=[(*group, "observation")], out_keys=[(*group, "logits")]),
        in_keys=[(*group, "logits")],
        out_keys=[(*group, "action")],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=(*group, "action_log_prob"),
    )
    critic = ValueOperator(value, in_keys=[(*group, "observation")], out_keys=[(*group, "state_value")])

    def v(obs: Any, *agent: Any) -> float:
        with torch.no_grad():
            return float(value(torch.as_tensor(obs, dtype=torch.float32))[0])

    def act(obs: Any) -> tuple[int, float, float]:
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=policy(torch.as_tensor(obs, dtype=torch.float32)))
            action = dist.sample()
        return int(action), float(dist.log_prob(action)), v(obs)

    if multi:
        pytest.importorskip("mpe2")
        from mpe2 import simple_spread_v3

        env = fe.record(
            simple_spread_v3.parallel_env(N=3, max_cycles=15), num_steps=500, gamma=0.9, gae_lambda=0.8, bootstrap_fn=v
        )
        obs, _ = env.reset(seed=0)
        for _ in range(40):
            actions = {}
            for agent, o in obs.items():
                actions[agent], log_prob, value_ = act(o)
                env.annotate(agent, discrete_log_probs=[log_prob], values=[value_])
            obs, *_ = env.step(actions)
            if not env.agents:
                obs, _ = env.reset()
        env.buffer.finish_path(np.array([v(obs[a]) for a in env.possible_agents]))
    else:
        env = fe.record(
            gym.make("CartPole-v1", max_episode_steps=40), num_steps=500, gamma=0.9, gae_lambda=0.8, bootstrap_fn=v
        )
        obs, _ = env.reset(seed=0)
        for _ in range(150):
            action, log_prob, value_ = act(obs)
            env.annotate(discrete_log_probs=[log_prob], values=[value_])
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
        env.buffer.finish_path(v(obs))
    return env.buffer, actor, critic


@pytest.mark.parametrize("multi", [False, True], ids=["one agent", "three agents"])
def test_torchrl_s_clip_ppo_loss_and_gae_read_a_recorded_rollout(multi: bool) -> None:
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    buffer, actor, critic = _ppo_rollout(multi)
    (batch,) = buffer.minibatches(len(buffer), shuffle=False)  # the rollout in time order
    td = batch.to_tensordict()
    group = ("agents",) if multi else ()
    lead = (len(buffer), 3) if multi else (len(buffer),)
    assert td[(*group, "action_log_prob")].shape == lead  # as ProbabilisticActor writes it
    for key in ("state_value", "advantage", "value_target"):  # as ValueOperator and GAE write them
        assert td[(*group, key)].shape == (*lead, 1)

    # TorchRL's GAE over the rollout gives the advantages the buffer wrote (same critic, same cuts)
    estimator = GAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)
    keys = {"advantage": (*group, "gae"), "value_target": (*group, "gae_target")}
    if multi:
        keys.update(
            reward=("agents", "reward"),
            done=("agents", "done"),
            terminated=("agents", "terminated"),
            value=("agents", "state_value"),
        )
    estimator.set_keys(**keys)
    theirs = estimator(td.exclude((*group, "state_value")))  # it asks the critic itself
    torch.testing.assert_close(theirs[(*group, "gae")], td[(*group, "advantage")], rtol=1e-4, atol=1e-4)

    # ClipPPOLoss reads the batch; its objective equals the clipped surrogate by hand
    with torch.no_grad():  # the policy moved since it acted: ratios differ from 1
        for p in actor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_bonus=False, normalize_advantage=False)
    if multi:
        loss_module.set_keys(
            action=("agents", "action"),
            sample_log_prob=("agents", "action_log_prob"),
            value=("agents", "state_value"),
            advantage=("agents", "advantage"),
            value_target=("agents", "value_target"),
            reward=("agents", "reward"),
            done=("agents", "done"),
            terminated=("agents", "terminated"),
        )
    losses = loss_module(td)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=actor.module[0].module(td[(*group, "observation")]))
        ratio = (dist.log_prob(td[(*group, "action")]) - td[(*group, "action_log_prob")]).exp()[..., None]
        advantage = td[(*group, "advantage")]
        expected = -torch.minimum(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
    assert not torch.allclose(ratio, torch.ones_like(ratio))
    torch.testing.assert_close(losses["loss_objective"], expected, rtol=1e-5, atol=1e-6)
