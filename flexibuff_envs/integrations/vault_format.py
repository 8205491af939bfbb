"""The flashbax vault as this package writes and reads it: TensorStore (imported here, so a
missing extra is one error), the leaves' names and layout, chunking and compression."""

from __future__ import annotations

import os
from typing import Any

from flexibuff_envs.errors import MissingExtraError, needs
from flexibuff_envs.spec import BufferSpec

try:
    import tensorstore as ts  # noqa: F401 - the one import of TensorStore, for vault and vault_read
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(needs("flexibuff_envs.integrations.vault", "tensorstore", "vault")) from error

#: flashbax's vault format version we write (and the major version we read)
VERSION = 1.2
#: the length flashbax gives a leaf's time axis (filled up to ``vault_index``)
TIME_AXIS = 10**13
#: rows of episodes written at a time
BLOCK_ROWS = 65_536
#: about the bytes of the steps read at a time
BLOCK_BYTES = 1 << 26
#: about the bytes of a leaf's chunk: whole rows (every agent, every feature) of consecutive
#: steps, so a frame is never cut into hundreds of chunks as TensorStore's default layout cuts it
CHUNK_BYTES = 1 << 22
#: the compressors a vault can be written with (`to_vault`'s ``compression``); TensorStore, and
#: so flashbax, reads each
COMPRESSION: dict[str, dict[str, Any] | None] = {
    "lz4": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
    "zstd": {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1},
    "gzip": {"id": "gzip", "level": 5},  # flashbax's default
    "none": None,
}
#: each field's leaf, where OG-MARL has a name for it (every other field goes to ``infos.<field>``)
LEAVES = {
    "obs": "observations",
    "individual_rewards": "rewards",
    "terminated": "terminals",
    "truncated": "truncations",
    "action_mask": "infos.legals",
    "state": "infos.state",
    "active": "infos.alive",
    "obs_": "infos.next_observations",
    "state_": "infos.next_state",
    "action_mask_": "infos.next_legals",
}
#: fields written as float32 0/1, as OG-MARL's datasets hold them
FLAGS = ("terminated", "truncated", "action_mask", "action_mask_", "active")
EPISODE_ENDS = "infos.episode_ends"
#: each next-value field and its base: a foreign vault's next values are its next steps'
NEXTS = (("obs_", "obs"), ("state_", "state"), ("action_mask_", "action_mask"))


def leaf_of(name: str, spec: BufferSpec) -> str:
    if name.endswith("__given"):  # where a sparse next value is given: beside it
        return leaf_of(name[: -len("_given")], spec) + "_given"
    if name == "discrete_actions" or (name == "continuous_actions" and not spec.discrete_action_cardinalities):
        return "actions"
    return LEAVES.get(name, f"infos.{name}")


def store_spec(base: str, leaf: str) -> dict[str, Any]:
    return {
        "driver": "zarr",
        "kvstore": {
            "driver": "ocdbt",
            "base": f"file://{os.path.abspath(base)}",
            "path": f"{leaf}." if leaf != "vault_index" else leaf,
        },
    }
