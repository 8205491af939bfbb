"""The module paths of releases before the package was laid out in the folders of its parts
(`docs/concepts/architecture.md`): each old path still imports, for this release, as the module
it became, with a DeprecationWarning naming the new path. Nothing in the package imports them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: old module path -> the module it is now
MOVED = {
    f"flexibuff_envs.{old}": f"flexibuff_envs.{new}"
    for old, new in {
        "codecs": "spec.observations",
        "action_codecs": "spec.actions",
        "kinds": "spec.env_kinds",
        "chain": "storage.next_values",
        "holders": "storage.holders",
        "rowwriters": "storage.row_writers",
        "fields": "storage.fields",
        "parts": "storage.stored_form",
        "packed": "storage.packed",
        "packed_ring": "storage.packed_ring",
        "compression": "storage.compression",
        "episodes": "index.lanes",
        "ends": "index.episode_ends",
        "returns": "index.returns",
        "samplers": "sampling.samplers",
        "nstep": "sampling.nstep",
        "priorities": "sampling.priorities",
        "chunk": "files.chunk",
        "header": "files.header",
        "header_values": "files.header_values",
        "fileformat": "files.format",
        "io": "files.io",
        "filling": "buffer.filling",
        "logged": "buffer.logged",
        "writer": "recording.writer",
        "rollout": "recording.rollout",
        "wrappers": "recording",
        "wrappers.core": "recording.lane_recorder",
        "wrappers.staged": "recording.single_agent",
        "wrappers.batched": "recording.vector",
        "wrappers.staging": "recording.vector_stage",
        "wrappers.blocks": "recording.vector_blocks",
        "wrappers.slots": "recording.agent_slots",
        "wrappers.setup": "recording.setup",
        "wrappers.replay": "recording.stage_replay",
        "wrappers.annotations": "recording.annotations",
        "wrappers.agent_state": "recording.agent_state",
        "wrappers.gymnasium_env": "recording.gymnasium_env",
        "wrappers.gymnasium_vector": "recording.gymnasium_vector",
        "wrappers.pettingzoo_aec": "recording.pettingzoo_aec",
        "wrappers.pettingzoo_base": "recording.pettingzoo_base",
        "wrappers.pettingzoo_parallel": "recording.pettingzoo_parallel",
        "log.journaling": "log.writer_journal",
        "log.tail": "log.append_window",
        "log.marks": "log.markers",
        "log.pieces": "log.append_plan",
        "log.ring": "log.ring_files",
        "log.stages": "log.stage_files",
        "log.write": "log.writer",
        "log.follow": "log.follower",
        "distributed": "integrations.ray",
    }.items()
}


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path (`MOVED`) as the module it became."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is now {new}: import it from there (the old path goes in the next release)",
            DeprecationWarning,
            stacklevel=_importer_level(),
        )
        return importlib.import_module(new)  # the module itself: one module, two names

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its new path."""


def _importer_level() -> int:
    """The ``stacklevel`` of the frame that imports (the first outside importlib's own)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def install() -> None:
    """Let the old paths import (once per process)."""
    if not any(isinstance(finder, OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
