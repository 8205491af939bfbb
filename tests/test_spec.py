"""Inference of the buffer layout from spaces (SPEC section 2)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec
from tests.envs import ToyEnv


@pytest.mark.parametrize(
    ("space", "size", "dtype"),
    [
        (spaces.Box(-1, 1, (2, 3, 4), np.float64), 24, "float32"),
        (spaces.Box(0, 255, (8, 8, 3), np.uint8), 192, "uint8"),
        (spaces.Box(0, 1, (5,), bool), 5, "bool"),
        (spaces.Box(-5, 5, (7,), np.int8), 7, "int8"),
        (spaces.Box(-5, 5, (7,), np.int32), 7, "float32"),
        (spaces.Discrete(5, start=3), 5, "float32"),
        (spaces.MultiDiscrete(np.array([[2, 3], [4, 5]])), 14, "float32"),
        (spaces.MultiBinary([2, 3]), 6, "float32"),
        (spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))), 45, "float32"),
        (spaces.Dict({"a": spaces.Box(-1, 1, (3,)), "b": spaces.Discrete(4)}), 7, "float32"),
    ],
)
def test_observation_size_and_dtype(space: spaces.Space, size: int, dtype: str) -> None:
    spec = fe.infer_spec(ToyEnv(space))
    assert (spec.obs_size, spec.obs_dtype) == (size, dtype)


def test_discrete_observation_honours_start() -> None:
    codec = obs_codec(spaces.Discrete(3, start=-1))
    assert codec.flatten(-1).tolist() == [1, 0, 0]
    assert codec.flatten(1).tolist() == [0, 0, 1]


def test_pettingzoo_style_dict_records_the_mask_not_as_obs() -> None:
    space = spaces.Dict(
        {"observation": spaces.Box(0, 1, (3, 3, 2), np.int8), "action_mask": spaces.Box(0, 1, (9,), np.int8)}
    )
    spec = fe.infer_spec(ToyEnv(space, spaces.Discrete(9)))
    assert (spec.obs_size, spec.obs_dtype, spec.action_mask) == (18, "int8", True)


@pytest.mark.parametrize(
    ("space", "heads", "starts", "continuous"),
    [
        (spaces.Discrete(6, start=2), (6,), (2,), 0),
        (
            spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, 0], [0, -2]])),
            (2, 3, 4, 5),
            (1, 0, 0, -2),
            0,
        ),
        (spaces.MultiBinary(3), (2, 2, 2), (0, 0, 0), 0),
        (spaces.Box(-1, 1, (2, 3)), (), (), 6),
        (
            spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Discrete(3, start=-1), spaces.MultiDiscrete([4, 2]))),
            (3, 4, 2),
            (-1, 0, 0),
            2,
        ),
        # Gymnasium sorts a Dict's keys: aim, fire, move
        (
            spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Box(-1, 1, (3,)), "fire": spaces.MultiBinary(1)}),
            (2, 4),
            (0, 0),
            3,
        ),
    ],
)
def test_action_layout(space: spaces.Space, heads: tuple, starts: tuple, continuous: int) -> None:
    spec = fe.infer_spec(ToyEnv(action_space=space))
    assert spec.discrete_action_cardinalities == heads
    assert spec.discrete_action_starts == starts
    assert spec.continuous_action_dimension == continuous


def test_mixed_action_encoding_puts_heads_then_continuous_in_order() -> None:
    space = spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Discrete(3, start=-1), spaces.Box(-1, 1, (1,))))
    discrete, continuous = action_codec(space).encode((np.array([0.5, -0.5]), 1, np.array([0.25])))
    assert discrete.tolist() == [2]
    assert continuous.tolist() == [0.5, -0.5, 0.25]


@pytest.mark.parametrize(
    "space",
    [
        spaces.Text(5),
        spaces.Graph(spaces.Box(-1, 1, (2,)), None),
        spaces.Sequence(spaces.Discrete(2)),
        spaces.Tuple((spaces.Discrete(2), spaces.Text(3))),
    ],
)
def test_unsupported_spaces_name_the_space_and_what_is_supported(space: spaces.Space) -> None:
    with pytest.raises(fe.UnsupportedSpaceError, match="observation space.*supported observation spaces: Box"):
        fe.infer_spec(ToyEnv(space))
    with pytest.raises(ValueError, match="action space.*supported action spaces: Discrete"):
        fe.infer_spec(ToyEnv(action_space=space))


@pytest.mark.parametrize("space", [spaces.Tuple(()), spaces.Dict({})])
def test_an_observation_space_with_no_values_is_refused_naming_it(space: spaces.Space) -> None:
    with pytest.raises(fe.UnsupportedSpaceError, match="observation space.*holds no values"):
        fe.infer_spec(ToyEnv(space))


def test_info_mask_turns_masks_on() -> None:
    env = gym.make("Taxi-v4")
    assert not fe.infer_spec(env).action_mask
    _, info = env.reset(seed=0)
    assert fe.infer_spec(env, info=info).action_mask


def test_spec_round_trips_through_a_dict() -> None:
    spec = fe.infer_spec(ToyEnv(action_space=spaces.MultiDiscrete([3, 4])))
    assert fe.BufferSpec.from_dict(spec.to_dict()) == spec


def test_infer_spec_rejects_what_is_not_an_env() -> None:
    with pytest.raises(TypeError, match="gymnasium.Env"):
        fe.infer_spec("CartPole-v1")


def test_observations_whose_one_hot_cannot_be_handed_out_are_refused_naming_the_limit() -> None:
    """A batch presents categorical observations one-hot: Discrete(2**31) would be 8 GiB a row."""
    with pytest.raises(fe.UnsupportedSpaceError, match=r"Discrete\(2147483648\) flattens to 2,147,483,648 .*1,048,576"):
        fe.infer_spec(ToyEnv(spaces.Discrete(2**31)))
    with pytest.raises(fe.UnsupportedSpaceError, match=r"obs_categories add up to 2,147,483,648 .*1,048,576"):
        fe.FlexibleBuffer(8, 2**31, obs_categories=[2**31])
    assert fe.infer_spec(ToyEnv(spaces.MultiDiscrete([1024] * 1024))).obs_categories == (1024,) * 1024  # at the limit
