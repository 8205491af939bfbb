"""Fuzzing buffer files in CI (a short budget): any mutation of a real file loads into a buffer
that works, or is refused with one BufferFileError. `tests/fuzz_files.py` has the mutations and
the long run (``FLEXIBUFF_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz_files.py`` here, or its
own loop and atheris)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz_files import Log, mutate, mutate_log, outcome, outcome_log, seed_files, seed_logs

EXAMPLES = int(os.environ.get("FLEXIBUFF_FUZZ_EXAMPLES", "500"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return seed_files(tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**64 - 1))
def test_any_mutation_of_a_file_loads_and_works_or_is_one_buffer_file_error(
    seeds: list[bytes], scratch: Path, seed: int
) -> None:
    rng = random.Random(seed)
    raw = mutate(seeds[rng.randrange(len(seeds))], rng)
    for mmap in (False, True):
        assert outcome(raw, scratch, mmap) is None


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> list[Log]:
    return seed_logs(tmp_path_factory.mktemp("logs"))


@settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**64 - 1))
def test_any_mutation_of_a_log_opens_and_works_or_is_one_buffer_file_error(
    logs: list[Log], scratch: Path, seed: int
) -> None:
    """The header (checksum recomputed), a commit entry's numbers (its checksum recomputed), a
    column's bytes (the commits' checksums recomputed), a file cut, grown or gone."""
    rng = random.Random(seed)
    files = mutate_log(logs[rng.randrange(len(logs))], rng)
    for mmap in (False, True):
        assert outcome_log(files, scratch, mmap) is None
