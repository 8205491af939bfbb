"""The suite runs without any one optional extra: tests that need it are skipped, never broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import of it raises ImportError, as when it is not installed
import pytest
raise SystemExit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"]))
"""


@pytest.mark.parametrize(
    "missing",
    [
        "ray",
        "torch",
        "pettingzoo,mpe2",
        "matplotlib",
        "stable_baselines3",
        "tensordict,torchrl",
        "minari,h5py",
        "supersuit",
        "tensorstore,flashbax,jax",
        "pyarrow,polars,datasets",
    ],
)
def test_the_suite_collects_without_an_extra(missing: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED, missing], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.lower().splitlines()[-1]


@pytest.mark.parametrize(
    ("module", "missing", "extra"), [("vault", "tensorstore", "vault"), ("parquet", "pyarrow", "parquet")]
)
def test_an_export_without_its_library_names_the_extra_to_install(module: str, missing: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import flexibuff_envs as fe\n"
        "try:\n"
        f"    import flexibuff_envs.integrations.{module}\n"
        "except fe.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    # the package is on no index: its extra from a clone, or the library itself
    said = f"pip install -e '.[{extra}]' in a clone of flexibuff_envs, or pip install '{missing}'"
    assert said in result.stdout, result.stdout + result.stderr[-2000:]


#: a recording each extra's smoke test exports or reads, with the extra's libraries alone
_RECORDED = """
import gymnasium as gym
import flexibuff_envs as fe
env = fe.record(gym.make("CartPole-v1"), num_steps=500)
env.reset(seed=0)
for t in range(200):
    if any(env.step(t % 2)[2:4]):
        env.reset()
"""
#: per extra, what a user of it runs once it is installed
_USES = {
    "minari": "from flexibuff_envs.integrations.minari import to_minari\nto_minari(env.buffer, 'cartpole/extra-v0')",
    "parquet": "from flexibuff_envs.integrations.parquet import to_parquet\nto_parquet(env.buffer, 'out')",
    "vault": "from flexibuff_envs.integrations.vault import to_vault\nto_vault(env.buffer, 'out', vault_uid='u')",
    "plot": "from flexibuff_envs.cli import main\nenv.buffer.save('run.fbuf')\nassert main(['plot', 'run.fbuf']) == 0",
    "torch": "assert env.buffer.sample_transitions(4, as_torch=True).obs.dtype.is_floating_point",
}
#: modules importable as if they were not installed (``Missing(names)`` first on ``sys.meta_path``)
_MISSING = """
import sys
class Missing:
    def __init__(self, names):
        self.names = frozenset(names)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
"""
#: installed with any environment: the tools of the environment, not a library of ours
_TOOLS = {"pip", "setuptools", "wheel"}


def _installed_by(extra: str) -> set[str]:
    """The distributions ``pip install 'flexibuff-envs[extra]'`` installs: the requirements of
    the package and of that extra, and theirs in turn (as installed here)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names: set[str] = set()
    visited: set[tuple[str, frozenset[str]]] = set()
    todo = [("flexibuff-envs", frozenset({extra}))]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in visited:
            continue
        visited.add(key)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        names.add(key[0])
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in (*extras, "")):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return names


@pytest.mark.parametrize("extra", sorted(_USES))
def test_each_extra_installs_what_its_integration_imports(extra: str, tmp_path: Path) -> None:
    """With only the libraries an extra installs importable (every other installed one blocked),
    its integration runs: ``pip install -e '.[minari]'`` left ``to_minari`` without PIL."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    allowed = _installed_by(extra) | _TOOLS
    blocked = sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in allowed for d in dists)
    )
    code = f"{_MISSING}\nsys.meta_path.insert(0, Missing({blocked!r}))\n{_RECORDED}{_USES[extra]}\n"
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari"), "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_gymnasium_required_has_what_the_package_imports() -> None:
    """`flexibuff_envs` imports `gymnasium.vector.AutoresetMode`, new in Gymnasium 1.1."""
    from importlib import metadata

    from packaging.requirements import Requirement

    required = [Requirement(text) for text in metadata.requires("flexibuff-envs") or []]
    (gymnasium,) = [r for r in required if r.name == "gymnasium" and r.marker is None]
    assert not gymnasium.specifier.contains("1.0.0") and gymnasium.specifier.contains("1.1.0")
