"""The import order of pyproject.toml's layers contract (import-linter's format) is the package's:
every import of a flexibuff_envs module, at the top or inside a function, points to a layer below
the importer's own or to its own; and every error the package raises is one of its own."""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs the backport
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flexibuff_envs"


def steps() -> dict[str, int]:
    """Module (first part below the package) -> its layer, 0 the lowest, from the contract."""
    (contract,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = contract["layers"][::-1]  # import-linter lists them from the top
    return {name.strip(): k for k, layer in enumerate(layers) for name in layer.split(":")}


def module_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each flexibuff_envs import, leaving out those under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flexibuff_envs"):
            parts = node.module.split(".")
            names = [parts[1]] if len(parts) > 1 else [alias.name for alias in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name.split(".")[1])
                for alias in node.names
                if alias.name.startswith("flexibuff_envs.")
            ]
    return found


def test_imports_point_the_way_the_layers_contract_says() -> None:
    order = steps()
    modules = [p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py" and p.name != "__main__.py"]
    assert {module_of(p) for p in modules} <= order.keys(), "a module the contract's layers do not list"
    wrong = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in modules
        for line, name in imports(p)
        if order[name] > order[module_of(p)]
    ]
    assert not wrong, wrong


def test_every_error_the_package_raises_is_a_flexibuff_error() -> None:
    """No ``raise ValueError(...)`` (or any builtin exception) in the package: each error is one of
    `flexibuff_envs.errors`' classes, which subclass the builtin a caller would catch, so
    ``except fe.FlexibuffError`` catches everything the package raises."""
    # errors: a Ctrl-C passed on (KeyboardInterrupt) or SystemExit is not one
    builtin = {
        name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, Exception)
    }
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in builtin:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} raises {target.id}")
    assert not found, "\n".join(found)


def test_the_code_is_formatted_linted_and_typed() -> None:
    """What a contributor runs before a commit, run by CI through the test command: ruff's format
    and lint with pyproject.toml's settings, and mypy on the package."""
    sources = ["flexibuff_envs", "tests", "benchmarks", "examples"]
    for command in (["ruff", "format", "--check", *sources], ["ruff", "check", *sources], ["mypy", "flexibuff_envs"]):
        done = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}{done.stderr}"


def test_no_module_is_over_400_lines() -> None:
    """A module that outgrows 400 lines is split along its seams."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 400
    }
    assert not long, long


def test_the_module_paths_of_earlier_releases_import_as_the_modules_they_became_with_a_warning() -> None:
    """Each old path (`flexibuff_envs._moved.MOVED`) is the new module itself, and importing it
    warns once, naming the new path; the package's own code imports none of them."""
    code = (
        "import importlib, warnings\n"
        "from flexibuff_envs._moved import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    assert module is importlib.import_module(new), old\n"
        "    assert [str(w.message).split(':')[0] for w in caught] == [f'{old} is now {new}'], (old, caught)\n"
        "from flexibuff_envs.samplers import Draw, Live  # a documented path of the last release\n"
        "from flexibuff_envs.distributed import RayCollector\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    from flexibuff_envs._moved import MOVED

    old = {name.split(".")[1] for name in MOVED if name.count(".") == 1}
    used = [f"{p.relative_to(ROOT)}:{line}" for p in PACKAGE.rglob("*.py") for line, name in imports(p) if name in old]
    assert not used, used
