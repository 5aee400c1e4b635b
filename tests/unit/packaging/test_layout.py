"""The one import root: every folder's subpackages are installed under ``tailguard``."""

import importlib
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _declared() -> tuple[set[str], dict[str, str]]:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(conf["packages"]), dict(conf["package-dir"])


def test_every_python_package_folder_is_declared_for_the_wheel() -> None:
    packages, dirs = _declared()
    found = set()
    for name, folder in dirs.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = found - packages
    assert not missing, (
        f"add to [tool.setuptools] packages or they drop out of the wheel: {missing}"
    )


def test_declared_packages_import_under_the_tailguard_root() -> None:
    packages, _ = _declared()
    for name in sorted(packages):
        assert name.split(".")[0] == "tailguard"
        module = importlib.import_module(name)
        assert module.__name__ == name


def test_streams_never_imports_faust_kafka_or_schemas() -> None:
    for path in (REPO / "streams").rglob("*.py"):
        text = path.read_text()
        for banned in ("import faust", "confluent_kafka", "aiokafka", "tailguard.schemas"):
            assert banned not in text, f"{path.name} imports {banned}"
