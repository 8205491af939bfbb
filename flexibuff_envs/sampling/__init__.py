"""Every way to draw a `FlexiBatch` from a buffer's rows: the buffer's reading half here; one
sampler per mode (`samplers`), prioritized replay's sum tree (`priorities`), n-step windows
(`nstep`). Imports: `index` and below.

Sampling: the reading half of `FlexibleBuffer`, every way to draw a `FlexiBatch` from its
rows (which rows: `flexibuff_envs.sampling.samplers`)."""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch, torch_converter
from flexibuff_envs.errors import ArgumentTypeError, InvalidArgumentError, positive_int
from flexibuff_envs.index import EpisodeIndex
from flexibuff_envs.interrupts import holding
from flexibuff_envs.sampling import nstep
from flexibuff_envs.sampling.nstep import windows
from flexibuff_envs.sampling.samplers import (
    Episodes,
    Given,
    Live,
    Minibatches,
    Prioritized,
    Sampler,
    Sequences,
    Uniform,
    Weighted,
)
from flexibuff_envs.storage.fields import NEXT

#: the fields an n-step batch sums or reads after each window (`nstep.gather`)
N_STEP = ("individual_rewards", "global_rewards", "terminated", "truncated", *NEXT)

if TYPE_CHECKING:
    from flexibuff_envs.spec import BufferSpec
    from flexibuff_envs.storage import Storage


_CHECKED: dict[tuple[tuple[str, ...], frozenset[str]], frozenset[str]] = {}


def checked_fields(fields: Collection[str], known: frozenset[str]) -> frozenset[str]:
    """``fields`` as a set of field names, or ValueError naming one that is not ``known``."""
    if isinstance(fields, str):
        raise ArgumentTypeError(f"fields must be a collection of field names, got the string {fields!r}")
    key = (tuple(fields), known)
    checked = _CHECKED.get(key)
    if checked is None:
        unknown = sorted(set(key[0]) - known)
        if unknown:
            raise InvalidArgumentError(f"fields: {unknown} are no batch fields; choose from {sorted(known)}")
        if len(_CHECKED) > 64:
            _CHECKED.clear()
        checked = _CHECKED[key] = frozenset(key[0])  # a training loop asks for the same ones each time
    return checked


class Half:
    """What each half of `FlexibleBuffer` (`Sampling`, `Filling`, `Logged`) reads of it: its
    layout, ring size, discounts and sampling generator, its arrays, and its episode index
    (every read commits what batch recorders hold first, `EpisodeIndex.read`)."""

    spec: BufferSpec
    num_steps: int
    gamma: float
    gae_lambda: float
    rng: np.random.Generator
    _store: Storage
    _index: EpisodeIndex


class Sampling(Half):
    """The reading half of `FlexibleBuffer`: every way to draw a `FlexiBatch` from its rows."""

    if TYPE_CHECKING:  # given by `FlexibleBuffer`

        def _prioritized(self) -> Prioritized: ...

    @holding
    def lift_max_priority(self, priority: float) -> None:
        """Rows new to prioritized replay get at least ``priority`` from now on (the highest
        priority given elsewhere: a sharded replay keeps its shards' in step)."""
        if not (isinstance(priority, (int, float)) and 0 < priority < np.inf):
            raise InvalidArgumentError(f"lift_max_priority: priority must be a finite number > 0, got {priority!r}")
        tree = self._prioritized().tree
        tree.max_priority = max(tree.max_priority, float(priority))

    @holding
    def priority_mass(self) -> tuple[float, float]:
        """The sum of ``priority ** alpha`` over the rows prioritized replay can draw, and its
        smallest positive value (inf when none): what weighs this buffer's draws against other
        buffers' (a sharded replay's exact importance weights)."""
        tree = self._prioritized().tree
        tree.sync(self._index.read())
        return tree.total, tree.minimum()

    def gather(
        self,
        idx: np.ndarray,
        *,
        as_torch: bool = False,
        device: Any = None,
        normalize_advantages: bool = False,
        valid: np.ndarray | None = None,
        fields: Collection[str] | None = None,
        weights: np.ndarray | None = None,
        n_step: int | None = None,
    ) -> FlexiBatch:
        """The rows ``idx`` (any integer shape) of every allocated field as a `FlexiBatch`.

        ``normalize_advantages`` shifts and scales this batch's advantages to mean 0, std 1;
        ``valid`` (sequences) is carried along like the fields; ``fields`` gathers only those
        (the others are None on the batch); ``n_step`` (``idx`` one-dimensional, live rows):
        rewards summed over each row's n-step window, next values and flags after it, and
        ``discounts`` (`flexibuff_envs.sampling.nstep`).
        """
        lanes, storage = self._index.read(), self._store
        wanted = None if fields is None else checked_fields(fields, storage.known)
        if n_step is None:
            out = storage.gather(idx, wanted)
        else:
            n = positive_int("n_step", n_step)
            if np.ndim(idx) != 1:
                raise InvalidArgumentError(
                    f"n_step: idx must be one-dimensional buffer rows, got shape {np.shape(idx)}"
                )
            arrays = storage.arrays
            w = windows(lanes, idx, n, arrays["active"], arrays["terminated"], arrays["truncated"])
            rest = [name for name in (storage.arrays.keys() if wanted is None else wanted) if name not in N_STEP]
            out = {**storage.gather(idx, rest), **nstep.gather(storage, w, self.gamma, wanted)}
        out["idx"] = idx
        out["agents"] = self.spec.agent_ids
        for name, value in (("valid", valid), ("weights", weights)):
            if value is not None:
                out[name] = value
        if normalize_advantages:
            advantages = out.get("advantages")
            if wanted is not None and "advantages" not in wanted:
                raise InvalidArgumentError("normalize_advantages=True but fields leaves out 'advantages'")
            if advantages is None:
                raise InvalidArgumentError(
                    "normalize_advantages=True but no advantages were recorded: "
                    "annotate values (env.annotate(values=...)) to get GAE"
                )
            # NaN marks steps without GAE yet (no value given, episode still running): skip them
            out["advantages"] = (advantages - np.nanmean(advantages)) / (np.nanstd(advantages) + 1e-8)
        if self.spec.extra_fields:
            out["extra"] = {name: out.pop(name) for name, _, _ in self.spec.extra_fields if name in out}
        if as_torch:
            convert = torch_converter(device)
            out = {name: convert(name, value) for name, value in out.items()}
        return FlexiBatch(**out)

    def draw(
        self,
        sampler: Sampler,
        *,
        as_torch: bool = False,
        device: Any = None,
        normalize_advantages: bool = False,
        fields: Collection[str] | None = None,
        n_step: int | None = None,
    ) -> Iterator[FlexiBatch]:
        """The batches ``sampler`` (`Uniform`, `Weighted`, `Prioritized`, `Given`, `Sequences`,
        `Episodes`, `Minibatches`, or one of your own) picks from the `Live` rows, gathered one
        at a time; the sampling methods below are this with their sampler. ``n_step`` turns any
        sampler's one-dimensional draws into n-step transitions (`sample_transitions`)."""
        for draw in sampler.draws(self._live(), self.rng):
            yield self.gather(
                draw.rows,
                as_torch=as_torch,
                device=device,
                valid=draw.valid,
                weights=draw.weights,
                normalize_advantages=normalize_advantages,
                fields=fields,
                n_step=n_step,
            )

    def _live(self) -> Live:
        """The rows samplers draw from, every staged step committed first."""
        return Live(self._index.read(), self._store)

    def sample_transitions(
        self,
        batch_size: int = 256,
        weighted: bool = False,
        as_torch: bool = False,
        device: Any = None,
        idx: np.ndarray | None = None,
        *,
        fields: Collection[str] | None = None,
        prioritized: bool = False,
        beta: float = 0.4,
        n_step: int | None = None,
    ) -> FlexiBatch:
        """``batch_size`` rows drawn uniformly with replacement (all agents of a row together).

        Args:
            weighted: draw rows in proportion to ``memory_weights`` (need not be normalised); not with ``prioritized``.
            idx: gather exactly these buffer rows instead of drawing.
            fields: gather only these (a DQN wants ``obs``, ``obs_``, ``discrete_actions``,
                ``individual_rewards``, ``terminated``); the others are None on the batch.
            prioritized: draw rows in proportion to ``priority ** alpha`` (see
                `update_priorities`), with ``batch.weights`` the importance-sampling weights for
                ``beta``.
            n_step: n-step returns: per agent, ``individual_rewards`` (``global_rewards``: the
                team's, over the episode's next n rows) is the discounted sum of the rewards of
                up to ``n`` of its steps from each row, fewer where its episode ends or the
                newest recorded row comes first; ``obs_``, ``state_``, ``action_mask_``,
                ``terminated`` and ``truncated`` are those of the window's last step, and
                ``discounts`` is ``gamma ** k`` for the ``k`` steps summed (the bootstrap's
                factor). ``n_step=1`` is the plain batch with ``discounts == gamma``.
        """
        sampler: Sampler
        if idx is not None:
            sampler = Given(idx)
        else:
            n = positive_int("batch_size", batch_size)
            if prioritized and weighted:
                raise InvalidArgumentError(
                    "sample_transitions: choose weighted=True (memory_weights) or prioritized=True "
                    "(update_priorities), not both"
                )
            if prioritized and not (isinstance(beta, numbers.Real) and 0 <= beta < np.inf):
                raise InvalidArgumentError(f"beta must be a finite number >= 0 (1 corrects fully), got {beta!r}")
            sampler = self._prioritized().batch(n, beta) if prioritized else Weighted(n) if weighted else Uniform(n)
        return self._one(sampler, as_torch=as_torch, device=device, fields=fields, n_step=n_step)

    def _one(self, sampler: Sampler, **options: Any) -> FlexiBatch:
        """The one batch ``sampler`` picks (`draw` without the iterator)."""
        (draw,) = sampler.draws(self._live(), self.rng)
        return self.gather(draw.rows, valid=draw.valid, weights=draw.weights, **options)

    def episodes(self, *, as_torch: bool = False, device: Any = None) -> Iterator[FlexiBatch]:
        """Every whole ended episode, one `FlexiBatch` of its rows in time order, lane by lane and
        oldest first (for exporters and checks; `sample_episodes` draws some at random). Each
        episode is gathered when it is reached; the set of episodes is the one held at the call.

        >>> [len(e) for e in buffer.episodes()]  # doctest: +SKIP
        [23, 17, 41]
        """
        return self.draw(Episodes(every=True), as_torch=as_torch, device=device)

    def episode_hashes(self) -> list[str]:
        """A content hash of every whole ended episode, in `episodes`' order: BLAKE2b (128 bits,
        hex) of what was recorded (each of `HASHED` the buffer holds, as a batch gives it: its
        name, dtype, shape and bytes), so the same episode hashes the same in a log, a file, a
        compressed buffer or an export, whatever its discounts, and a dataset's episodes can be
        compared with another's or cited."""
        return [episode_hash(episode) for episode in self.episodes()]

    def sample_episodes(
        self,
        max_batch_size: int = 256,
        n_episodes: int | None = None,
        as_torch: bool = False,
        device: Any = None,
    ) -> list[FlexiBatch]:
        """Whole ended episodes, each a `FlexiBatch` of its rows in time order.

        Draws ``n_episodes`` distinct episodes, or (when None) random episodes while their total
        length fits ``max_batch_size`` (at least one, never cut). The list is in recording order.
        """
        n = None if n_episodes is None else positive_int("n_episodes", n_episodes)
        return list(self.draw(Episodes(n, max_batch_size), as_torch=as_torch, device=device))

    def sample_sequences(
        self,
        batch_size: int,
        seq_len: int,
        as_torch: bool = False,
        device: Any = None,
    ) -> FlexiBatch:
        """``batch_size`` windows of ``seq_len`` consecutive steps, each inside one episode.

        Windows start at uniformly drawn rows; one that reaches its episode's end is padded with
        that last row and ``valid`` is False there. Fields are ``[n_agents, batch, seq_len, ...]``
        (``[batch, seq_len, ...]`` for global fields or one agent); ``valid`` is ``[batch, seq_len]``.
        """
        sampler = Sequences(positive_int("batch_size", batch_size), positive_int("seq_len", seq_len))
        return self._one(sampler, as_torch=as_torch, device=device)

    def minibatches(
        self,
        batch_size: int,
        shuffle: bool = True,
        as_torch: bool = False,
        device: Any = None,
        drop_last: bool = False,
        normalize_advantages: bool = False,
        *,
        fields: Collection[str] | None = None,
    ) -> Iterator[FlexiBatch]:
        """One pass over every live row in batches of ``batch_size`` (PPO epochs).

        ``normalize_advantages``: each minibatch's advantages to mean 0, std 1 (CleanRL's norm_adv).
        ``fields``: gather only these, as `sample_transitions`.
        """
        sampler = Minibatches(positive_int("batch_size", batch_size), shuffle, drop_last)
        return self.draw(
            sampler, as_torch=as_torch, device=device, normalize_advantages=normalize_advantages, fields=fields
        )


#: the fields an episode's hash covers: what was recorded, not what was computed from it
HASHED = (
    "obs",
    "obs_",
    "state",
    "state_",
    "discrete_actions",
    "continuous_actions",
    "action_mask",
    "individual_rewards",
    "terminated",
    "truncated",
    "active",
)


def episode_hash(episode: FlexiBatch) -> str:
    """`Sampling.episode_hashes`' hash of one episode."""
    digest = hashlib.blake2b(digest_size=16)
    for name in HASHED:
        value = getattr(episode, name)
        if value is None:
            continue
        for part in value if isinstance(value, list) else [value]:  # masks: one array per head
            array = np.ascontiguousarray(part)
            array = array.astype(array.dtype.newbyteorder("<"), copy=False)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()
