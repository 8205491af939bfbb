"""`FlexibleBuffer`: FlexiBuff's data model, a ring and its episode index (halves: `filling`, `logged`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from flexibuff_envs.buffer.filling import Filling
from flexibuff_envs.buffer.logged import Logged
from flexibuff_envs.errors import (
    BufferMemoryError,
    InvalidArgumentError,
    plain_dtype,
    positive_int,
)
from flexibuff_envs.files import io
from flexibuff_envs.index import EpisodeIndex, count_whole, episode_table
from flexibuff_envs.index.returns import check_gamma
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log import Follower
from flexibuff_envs.sampling import Sampling
from flexibuff_envs.sampling.priorities import ALPHA, check_alpha
from flexibuff_envs.sampling.samplers import Prioritized, checked_rows, checked_weights, live_rows
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import Storage, packable
from flexibuff_envs.storage.compression import Compress, available_memory
from flexibuff_envs.storage.fields import NEXT
from flexibuff_envs.storage.fields import extra_fields as extra_fields_of


def _allocate(storage: Storage, wanted: Mapping[str, bool]) -> None:
    """The fields ``wanted`` says to allocate, and the chains of their next values."""
    for field, on in wanted.items():
        if on:
            storage.ensure(field)
    for next_field, base in NEXT.items():
        if base in storage.arrays:
            storage.chain(next_field)


def rows_that_fit(row_bytes: int, budget: int) -> int:
    """Rows of ``row_bytes`` (every lane's) that ``budget`` bytes hold (at least 1)."""
    return max(1, budget // max(1, row_bytes))


class FlexibleBuffer(Filling, Logged, Sampling):
    """A ring of ``num_steps`` rows per env lane; a row is one timestep of all agents.

    The keywords are FlexiBuff's, so its users switch without touching their agents. Recorders
    (`flexibuff_envs.record`) fill it; `sample_transitions`, `sample_episodes` and `minibatches`
    read it. When a lane is full, its oldest episodes are forgotten whole: a sampled episode is
    never partly overwritten.

    Args:
        num_steps: rows per lane.
        obs_size: length of one agent's flat observation.
        discrete_action_cardinalities: one cardinality per discrete action head.
        continuous_action_dimension: continuous action values per agent
            (FlexiBuff 0.0.3's spelling ``continious_action_dimension`` is accepted too).
        action_mask: record legal-action masks (``action_mask``, ``action_mask_``).
        n_agents: agents per row; with 1 the agent axis is dropped from batches.
        state_size: length of the global state, or None.
        global_reward: allocate that field up front; so do ``global_auxiliary_reward``,
            ``individual_reward``, ``individual_auxiliary_reward``, ``log_prob_discrete``,
            ``log_prob_continuous`` and ``memory_weights``.
        values: allocate value storage up front.
        path: where `save` writes when given no path (``path/name.fbuf``), with ``name``.
        agent_ids: agent names in buffer order.
        obs_dtype: dtype observations are stored in (uint8 keeps images at a byte per value).
        state_dtype: dtype the global state is stored in (a recorder's: its ``state_space``'s).
        n_envs: independent lanes, one per sub-env of a vector env.
        gamma: discount for ``G`` and GAE.
        gae_lambda: GAE's lambda; advantages and returns are written wherever values were annotated.
        seed: seed of the sampling random generator.
        obs_categories: observations are categories of these sizes (their sum is ``obs_size``):
            rows store one index + 1 per category, batches get the one-hot flattening.
        alpha: prioritized replay's exponent: rows are drawn in proportion to ``priority ** alpha``.
        extra_fields: per-agent fields of your own, ``{"hidden": (64,)}`` or ``{"hidden": ((64,),
            "float16")}`` (float32 unless given): filled by ``annotate(hidden=h)`` or `field`,
            NaN (0 for integers) where not given, on every batch as ``batch.hidden``, kept in files.
        compress: keep ``obs`` and ``state`` compressed in memory, a zstd frame a row, lossless:
            "auto" those of images, ``{"obs": "zstd"}`` by field, or None (raw: fastest to sample).
    """

    def __init__(
        self,
        num_steps: int = 10,
        obs_size: int = 1,
        discrete_action_cardinalities: list[int] | tuple[int, ...] | None = None,
        continuous_action_dimension: int | None = None,
        action_mask: bool | list[bool] = False,
        n_agents: int = 1,
        state_size: int | None = None,
        global_reward: bool = False,
        global_auxiliary_reward: bool = False,
        individual_reward: bool = False,
        individual_auxiliary_reward: bool = False,
        log_prob_discrete: bool = False,
        log_prob_continuous: int = 0,
        memory_weights: bool = False,
        path: str = "./default_dir/",
        name: str = "flexibuff_test",
        *,
        continious_action_dimension: int | None = None,
        values: bool = False,
        agent_ids: list[str] | tuple[str, ...] | None = None,
        obs_dtype: str = "float32",
        state_dtype: str = "float32",
        n_envs: int = 1,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        seed: int | None = None,
        obs_categories: list[int] | tuple[int, ...] | None = None,
        alpha: float = ALPHA,
        extra_fields: Mapping[str, Any] | None = None,
        compress: Compress = None,
    ) -> None:
        self.num_steps = positive_int("num_steps", num_steps)
        cards = tuple(positive_int("discrete_action_cardinalities", c) for c in (discrete_action_cardinalities or ()))
        n_agents = positive_int("n_agents", n_agents)
        ids = tuple(agent_ids) if agent_ids is not None else tuple(f"agent_{i}" for i in range(n_agents))
        if len(ids) != n_agents:
            raise InvalidArgumentError(f"agent_ids has {len(ids)} names but n_agents is {n_agents}")
        self.spec = BufferSpec(
            obs_size=positive_int("obs_size", obs_size),
            obs_dtype=plain_dtype("obs_dtype", obs_dtype).name,
            discrete_action_cardinalities=cards,
            continuous_action_dimension=int(continuous_action_dimension or continious_action_dimension or 0),
            action_mask=bool(any(action_mask) if isinstance(action_mask, (list, tuple)) else action_mask)
            and bool(cards),
            n_agents=n_agents,
            agent_ids=ids,
            state_size=None if state_size is None else positive_int("state_size", state_size),
            state_dtype=plain_dtype("state_dtype", state_dtype).name,
            n_envs=positive_int("n_envs", n_envs),
            discrete_action_starts=(0,) * len(cards),
            obs_shape=(int(obs_size),),
            obs_categories=tuple(positive_int("obs_categories", c) for c in (obs_categories or ())),
            extra_fields=extra_fields_of(extra_fields),
        )
        if self.spec.obs_categories and sum(self.spec.obs_categories) != self.spec.obs_size:
            raise InvalidArgumentError(
                f"obs_categories {self.spec.obs_categories} sum to {sum(self.spec.obs_categories)}, "
                f"but obs_size is {self.spec.obs_size}"
            )
        self.alpha = check_alpha(alpha)
        self._priorities: Prioritized | None = None  # the prioritized sampler, made on its first use
        self._log: Follower | None = None  # the episode log ended episodes go to (`log_to`)
        self._sessions: list[dict[str, Any]] = []  # the recording sessions that wrote it (`sessions`)
        self.gamma = check_gamma(gamma)
        self.gae_lambda = check_gamma(gae_lambda, "gae_lambda")
        self.path, self.name = path, name
        self.rng = np.random.default_rng(seed)
        self._store = Storage(
            self.spec,
            self.num_steps * self.spec.n_envs,
            lanes=self.spec.n_envs,
            log_prob_continuous=int(log_prob_continuous),
            compress=packable(compress),
        )
        self._index = EpisodeIndex(self.spec.n_envs, self.num_steps, n_agents, self._forget, self._open)
        self._ring = self._index.ring  # the lanes as they stand (recorders' own lanes; commits skipped)
        wanted = {
            "obs": True,
            "terminated": True,
            "truncated": True,
            "active": True,
            "G": True,
            "state": state_size is not None,
            "discrete_actions": bool(cards),
            "continuous_actions": self.spec.continuous_action_dimension > 0,
            "action_mask": self.spec.action_mask,
            "individual_rewards": individual_reward,
            "global_rewards": global_reward,
            "individual_auxiliary_rewards": individual_auxiliary_reward,
            "global_auxiliary_rewards": global_auxiliary_reward,
            "discrete_log_probs": log_prob_discrete and bool(cards),
            "continuous_log_probs": log_prob_continuous > 0,
            "memory_weights": memory_weights,
            "values": values,
            **{name: True for name, _, _ in self.spec.extra_fields},
        }
        try:
            _allocate(self._store, wanted)
        except MemoryError:
            probe = Storage(
                self.spec, self.spec.n_envs, lanes=self.spec.n_envs, log_prob_continuous=int(log_prob_continuous)
            )
            _allocate(probe, wanted)
            raise BufferMemoryError(
                f"num_steps={self.num_steps:,} rows x {self.spec.n_envs} lane(s) of {probe.row_nbytes:,} bytes "
                f"({self.num_steps * probe.row_nbytes * self.spec.n_envs / 2**30:,.1f} GiB) cannot be reserved here; "
                f"{rows_that_fit(probe.row_nbytes * self.spec.n_envs, available_memory()):,} rows per lane fit in the "
                f"{available_memory() / 2**30:,.1f} GiB of memory available: pass a smaller num_steps"
            ) from None

    @classmethod
    def from_spec(cls, spec: BufferSpec, *, num_steps: int, **options: Any) -> FlexibleBuffer:
        """A buffer laid out as ``spec``, by default with both reward fields a recorder fills;
        ``n_envs=`` gives it another number of lanes (one per recorder that shares it)."""
        options.setdefault("global_reward", True)
        options.setdefault("individual_reward", True)
        spec = dataclasses.replace(spec, n_envs=options.pop("n_envs", spec.n_envs))
        buffer = cls(
            num_steps,
            spec.obs_size,
            spec.discrete_action_cardinalities,
            spec.continuous_action_dimension,
            spec.action_mask,
            spec.n_agents,
            spec.state_size,
            agent_ids=spec.agent_ids,
            obs_dtype=spec.obs_dtype,
            state_dtype=spec.state_dtype,
            n_envs=spec.n_envs,
            obs_categories=spec.obs_categories,
            extra_fields={name: (shape, dtype) for name, shape, dtype in spec.extra_fields},
            **options,
        )
        buffer.spec = buffer._store.spec = spec
        return buffer

    # ------------------------------------------------------------------ sampling

    def __len__(self) -> int:
        return sum(lane.size for lane in self._index.read())

    @property
    def n_episodes(self) -> int:
        """Ended episodes held whole."""
        return count_whole(self._index.read())

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields this buffer holds, sorted (absent ones are ``None`` on every batch)."""
        return tuple(sorted([*(name for name, _ in self._store), *self._store.chains]))

    @property
    def nbytes(self) -> int:
        """Bytes held by the allocated arrays."""
        return self._store.nbytes

    @property
    def nbytes_per_row(self) -> int:
        """Bytes one row takes in the allocated arrays (next values stored apart are not per row)."""
        return self._store.row_nbytes

    @holding
    def clear(self) -> None:
        """Forget everything recorded (on-policy training starts each rollout empty).

        An episode still running goes on recording; its steps before the clear are gone, so it
        will not be handed out by `sample_episodes`, but its ``G`` and GAE cover what is kept.
        """
        self._settle_log()
        lanes = self._index.change()
        live = live_rows(lanes)
        for lane in lanes:
            lane.clear()
        self._store.arrays["G"][:, live] = np.nan  # only rows that were recorded were touched
        for chain in self._store.chains.values():
            chain.reset(live)

    def _prioritized(self) -> Prioritized:
        if self._priorities is None:
            self._priorities = Prioritized.new(self._store.rows, self.spec.n_envs, self.alpha)
        return self._priorities

    @property
    def max_priority(self) -> float | None:
        """The highest priority given so far (new rows get it), or None before prioritized replay
        is first used."""
        return None if self._priorities is None else self._priorities.max_priority

    @holding
    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray | float) -> None:
        """New priorities for rows ``idx`` (a prioritized batch's ``idx``), e.g. ``|TD error| +
        1e-6``: they are drawn in proportion to ``priority ** alpha`` from now on. Rows no longer
        recorded are left out; new rows get the highest priority given so far. Both may be torch
        tensors (on any device, needing grad or not)."""
        rows = checked_rows("update_priorities", idx, self._store.rows)
        values = checked_weights("update_priorities", "priorities", priorities, rows)
        self._prioritized().update(self._index.read(), rows.reshape(-1), values.reshape(-1))

    @holding
    def set_memory_weights(self, idx: np.ndarray, weights: np.ndarray | float) -> None:
        """Set the sampling weight of rows ``idx`` (e.g. ``batch.idx`` after computing TD errors;
        either may be a torch tensor)."""
        rows = checked_rows("set_memory_weights", idx, self._store.rows)
        self._store.ensure("memory_weights")[rows] = checked_weights("set_memory_weights", "weights", weights, rows)

    # ------------------------------------------------------------------ summaries and files

    def episode_stats(self) -> dict[str, np.ndarray]:
        """Per ended whole episode, in recording order: ``lengths [E]`` and ``returns [E, n_agents]``."""
        episodes = episode_table(self._index.read())
        rows, last = episodes.all_rows()
        rewards = self._store.ensure("individual_rewards").take(rows, axis=1).astype(np.float64)
        sums = np.add.reduceat(rewards, last - episodes.lengths + 1, axis=1) if rows.size else rewards[:, :0]
        return {"lengths": episodes.lengths, "returns": sums.T.reshape(len(episodes), self.spec.n_agents)}

    def save(self, path: str | os.PathLike[str] | None = None, *, compress: Compress = "auto") -> str:
        """Write the buffer to one file (no pickle, atomic); returns the path written.

        ``compress``: which parts are stored compressed (zstd; lossless, bit-exact): "auto"
        those of image observations and states (integers, a kilobyte a row or more), a mapping
        ``{"obs": "zstd"}`` by field, or None. "auto" stores raw a part that does not compress to
        80% of its bytes. A compressed part is decoded into memory when the file is loaded
        (``mmap=True`` maps the others).

        Raises:
            BufferSaveError: an ``OSError`` naming ``path`` (a directory, no permission, a full
                disk); a file already at ``path`` is intact.
        """
        unknown = sorted(set(compress) - set(self._store.fields)) if isinstance(compress, Mapping) else []
        if unknown:
            raise InvalidArgumentError(f"save: compress names {unknown[0]!r}, which is no field of this buffer")
        target = os.fspath(path) if path is not None else os.path.join(self.path, self.name + ".fbuf")
        settings = {
            "spec": self.spec.to_dict(),
            "num_steps": self.num_steps,
            "gamma": self.gamma,
            "gae_lambda": self.gae_lambda,
            "path": self.path,
            "name": self.name,
            "rng": self.rng.bit_generator.state,
            "alpha": self.alpha,
            "sessions": self._sessions,
        }
        lanes = self._index.read()
        priorities = None if self._priorities is None else self._priorities.saved(lanes, self._store.rows)
        io.save(target, settings, self._store, lanes, priorities, compress)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, mmap: bool = False, compress: Compress = None) -> FlexibleBuffer:
        """Read a buffer written by `save`; it records and samples exactly as before.

        Args:
            mmap: map the file instead of reading it: opening takes the same time for any size,
                rows are read from disk when sampled, and changes stay in memory (copy-on-write),
                never in the file. Only the header's checksum is checked, not the data's; its
                compressed parts are decoded into memory. A file whose lanes are partly empty is
                read instead (its rows keep their numbers).
            compress: keep ``obs`` and ``state`` compressed in memory, as the constructor's
                ``compress`` (read and packed a few hundred rows at a time); not with ``mmap``.
        """
        if compress is not None and mmap:
            raise InvalidArgumentError("load: mmap maps the rows as the file holds them; compress needs them read")
        with io.BufferFile(os.fspath(path)) as file:
            header = file.header
            try:
                buffer = cls.from_spec(
                    header.spec,
                    num_steps=header.num_steps,
                    gamma=header.gamma,
                    gae_lambda=header.gae_lambda,
                    log_prob_continuous=header.log_prob_width,
                    alpha=header.alpha,
                    global_reward=False,
                    individual_reward=False,
                    compress=compress,
                )
            except MemoryError:
                file.fail(
                    f"its ring of {header.num_steps:,} rows x {header.spec.n_envs} lanes cannot be allocated "
                    "on this machine"
                )
            buffer.path, buffer.name, buffer._sessions = header.path, header.name, list(header.sessions)
            buffer.rng.bit_generator.state = header.rng
            leaves = io.fill(file, buffer._store, buffer._index.ring, mmap=mmap)
        if leaves is not None:
            buffer._priorities = Prioritized.restored(leaves, buffer._index.ring, buffer.alpha, header.max_priority)  # type: ignore[arg-type]
        if not mmap:
            buffer.compact()  # an older file's next values, written out row by row: keep them once
        return buffer

    def __repr__(self) -> str:
        return (
            f"FlexibleBuffer(rows={len(self)}/{self.num_steps * self.spec.n_envs}, "
            f"episodes={self.n_episodes}, agents={self.spec.n_agents}, "
            f"fields={list(self.fields)})"
        )
