"""A buffer's whole episodes as plain arrays, field by field, and such arrays back into a buffer:
what the dataset exports write (`vault`, `parquet`) and their imports read. numpy only.

An episode's arrays are laid out as batches are, with the agent axis always kept: per-agent
fields ``[n_agents, T, ...]``, global ones (`GLOBAL`) ``[T, ...]``; action masks are joined
over their heads (``[n_agents, T, sum(cardinalities)]``), fields of your own go by their names.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.index import episode_ranges
from flexibuff_envs.index.origins import origin
from flexibuff_envs.sampling.samplers import Draw, Live
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage.fields import FIELDS, NEXT, encode

#: a buffer, or the path of a buffer file or an episode log
Source = FlexibleBuffer | str | os.PathLike[str]
#: consecutive whole episodes: their lengths, and each field's rows back to back
Block = tuple[np.ndarray, dict[str, np.ndarray]]

#: fields with one value per row, not per agent
GLOBAL = frozenset(name for name, field in FIELDS.items() if not field.per_agent)
#: batch fields that say how a batch was drawn, not what was recorded
DRAWN = frozenset({"idx", "valid", "weights", "discounts", "n_steps", "extra", "agents"})
#: fields a buffer computes when an episode ends; an import writes the given ones over them
COMPUTED = ("G", "advantages", "returns")
#: the `FlexibleBuffer` keyword that allocates each optional field
_OPTION = {
    "global_rewards": "global_reward",
    "individual_rewards": "individual_reward",
    "global_auxiliary_rewards": "global_auxiliary_reward",
    "individual_auxiliary_rewards": "individual_auxiliary_reward",
    "discrete_log_probs": "log_prob_discrete",
    "values": "values",
    "memory_weights": "memory_weights",
}


def open_source(source: Source, *, mmap: bool = True) -> FlexibleBuffer:
    """``source`` itself, or the buffer file or episode log it names (mapped by default)."""
    if isinstance(source, FlexibleBuffer):
        return source
    path = os.fspath(source)
    if os.path.isdir(path):
        return FlexibleBuffer.open(path, mmap=mmap)
    return FlexibleBuffer.load(path, mmap=mmap)


def episode_arrays(batch: FlexiBatch, spec: BufferSpec) -> dict[str, np.ndarray]:
    """One episode's recorded fields (the module's layout) from its batch."""
    out = {}
    values = [(f.name, getattr(batch, f.name)) for f in dataclasses.fields(FlexiBatch) if f.name not in DRAWN]
    for name, value in [*values, *batch.extra.items()]:
        if value is None:
            continue
        if isinstance(value, list):  # a mask per discrete head
            value = np.concatenate(value, axis=-1)
        out[name] = value[None] if spec.n_agents == 1 and name not in GLOBAL else value
    return out


def blocks(
    buffer: FlexibleBuffer, rows: int, nbytes: int = 1 << 26, chosen: np.ndarray | None = None
) -> Iterator[Block]:
    """``buffer``'s whole episodes in recording order (or only the ``chosen`` ones, by number), in
    blocks of about ``rows`` rows and at most about ``nbytes`` bytes (an episode is never split),
    each block gathered at once."""
    runs = _Runs(max(1, min(rows, nbytes // max(buffer.nbytes_per_row, 1))), chosen)
    for k, batch in enumerate(buffer.draw(runs)):
        yield runs.lengths[k], episode_arrays(batch, buffer.spec)


@dataclasses.dataclass
class _Runs:
    """A sampler (`FlexibleBuffer.draw`): every whole ended episode in recording order (or the
    ``chosen`` ones), about ``rows`` rows a batch; ``lengths`` holds each batch's episode lengths
    once it is drawn."""

    rows: int
    chosen: np.ndarray | None = None
    lengths: list[np.ndarray] = dataclasses.field(default_factory=list)

    def draws(self, live: Live, rng: np.random.Generator) -> Iterator[Draw]:
        pool = live.episodes()
        which = np.arange(len(pool)) if self.chosen is None else self.chosen
        for first, stop in episode_ranges(pool.lengths[which], self.rows):
            these = which[first:stop]
            self.lengths.append(pool.lengths[these])
            yield Draw(np.concatenate([pool.rows(int(k)) for k in these]))


def into_buffer(
    spec: BufferSpec,
    fields: Collection[str],
    source: Iterable[Block],
    *,
    rows: int,
    where: str,
    log_prob_width: int = 0,
    log: str | os.PathLike[str] | None = None,
    sessions: Sequence[dict[str, Any]] = (),
    origins: np.ndarray | None = None,
    **options: object,
) -> FlexibleBuffer:
    """A buffer of ``spec`` holding the episodes of ``source`` (blocks holding ``fields``,
    ``rows`` in all, read one at a time), one lane, each episode ended as a recording ends it: ``G`` (and GAE, with
    values) computed, unless the blocks give them. ``options`` go to `FlexibleBuffer.from_spec`
    (``num_steps`` defaults to ``rows``: a smaller ring keeps the newest episodes). With ``log``,
    every episode is also appended to that episode log (made, or continued) as it is added, so
    a ring smaller than the source turns a dataset larger than memory into a log. ``sessions``:
    the recording sessions the dataset names (`FlexibleBuffer.sessions`); ``origins``: its
    episodes' (`index.origins`; by default each begun by the newest session, without a seed).

    Raises:
        BufferFileError: the values do not fit ``spec`` (a dataset whose layout and arrays
            disagree; ``where`` names it).
    """
    source = iter(source)
    first = next(source, None)
    if first is not None:  # the widest fields, checked before a ring of their width is reserved
        for name, width in (("obs", spec.obs_size), ("state", spec.state_size)):
            if name in first[1] and first[1][name].shape[-1] != width:
                raise BufferFileError(
                    f"{where}: its layout gives {name} {width:,} values a row and its arrays "
                    f"hold {first[1][name].shape[-1]:,}"
                )
    options.setdefault("num_steps", max(rows, 1))
    allocated = {keyword: name in fields for name, keyword in _OPTION.items()}
    buffer = FlexibleBuffer.from_spec(
        dataclasses.replace(spec, n_envs=1),
        log_prob_continuous=log_prob_width,
        **{**allocated, **options},  # type: ignore[arg-type]
    )
    for session in sessions:  # the recordings the dataset came from, named in the log too
        buffer.add_session(session)
    if log is not None:
        buffer.log_to(log)
    try:
        blocks = itertools.chain([first] if first else [], source)
        return _fill(buffer, spec, fields, blocks, log_prob_width, where, origins)
    except (ValueError, MemoryError) as exc:  # a field wider than its values, or too wide to allocate
        raise BufferFileError(f"{where}: its arrays do not fit the layout it declares ({exc})") from None
    finally:
        if log is not None:
            buffer.close_log()


def _fill(
    buffer: FlexibleBuffer,
    spec: BufferSpec,
    fields: Collection[str],
    source: Iterable[Block],
    log_prob_width: int,
    where: str,
    origins: np.ndarray | None,
) -> FlexibleBuffer:
    made = origin(len(buffer.sessions) - 1, 0, 0, 0)
    begun = iter([] if origins is None else origins.tolist())
    names = [name for name in fields if name not in COMPUTED and name not in NEXT]
    targets = {
        name: buffer.field(name, width=log_prob_width if name == "continuous_log_probs" else None)
        for name in [*names, *(name for name in COMPUTED if name in fields)]
    }
    following = [name for name in NEXT if name in fields]
    shapes = {name: target.shape[2 if name not in GLOBAL else 1 :] for name, target in targets.items()}
    shapes.update({name: buffer.field(NEXT[name]).shape[2 if name not in GLOBAL else 1 :] for name in following})
    for lengths, arrays in source:
        stored = {name: encode(spec, name, arrays[name]) for name in [*targets, *following]}
        _check(spec, stored, shapes, int(lengths.sum()), where)
        # next values a block at a time, unless the ring is smaller than the block (it keeps the
        # newest) or a log takes each episode whole as it ends
        whole = int(lengths.sum()) <= buffer.num_steps and not buffer.logging
        written = []
        for start, length in zip((np.cumsum(lengths) - lengths).tolist(), lengths.tolist()):
            buffer._begin_episode(0, next(begun, made))
            at = buffer.claim_rows(length)
            span = slice(start, start + length)
            for name in names:
                _put(targets[name], name, at, stored[name], span)
            for name in [] if whole else following:
                buffer.write_next(name, at, stored[name][..., span, :])
            buffer.end_episode()
            for name in COMPUTED:
                if name in stored:
                    _put(targets[name], name, at, stored[name], span)
            written.append(at)
        for name in following if whole else []:  # each stored once where it is the next row's
            buffer.write_next(name, np.concatenate(written), stored[name], np.cumsum(lengths) - 1)
    return buffer


def _check(
    spec: BufferSpec, stored: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], steps: int, where: str
) -> None:
    """`BufferFileError` naming ``where`` and the first of a block's ``stored`` fields (``steps``
    rows) that is not of the shape the buffer stores it in (nothing is broadcast), or discrete
    actions outside their heads' cardinalities."""
    for name, values in stored.items():
        lead = (steps,) if name in GLOBAL else (spec.n_agents, steps)
        if values.shape != (*lead, *shapes[name]):
            raise BufferFileError(
                f"{where}: {name} is {values.shape}; the layout stores it as {(*lead, *shapes[name])}"
            )
    actions = stored.get("discrete_actions")
    if actions is not None and actions.size:
        cards = np.array(spec.discrete_action_cardinalities)
        wrong = (actions < 0) | (actions >= cards)
        if wrong.any():
            head = int(np.flatnonzero(wrong.reshape(-1, len(cards)).any(axis=0))[0])
            value = int(actions[..., head][wrong[..., head]][0])
            raise BufferFileError(
                f"{where}: discrete_actions holds {value} for head {head}, outside its {int(cards[head])} actions"
            )


def _put(target: np.ndarray, name: str, at: np.ndarray, values: np.ndarray, span: slice) -> None:
    if name in GLOBAL:
        target[at] = values[span]
    else:
        target[:, at] = values[:, span]


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a dataset holds, read without its rows (for ``flexibuff-envs inspect``)."""

    kind: str
    agents: tuple[str, ...]
    episodes: int
    steps: int
    #: each field (or leaf, or column): its shape per row and dtype
    fields: dict[str, str]
    #: the recording sessions it names (`FlexibleBuffer.sessions`)
    sessions: tuple[dict[str, Any], ...] = ()
