"""The package as users install it: its metadata, a wheel that holds every module, and every
module importable from wherever the package was installed (CI runs the suite against the built
wheel, from a folder without the sources: `.ci/run`)."""

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import onnx_lnfold

from conftest import ROOT

PACKAGE_DIR = Path(onnx_lnfold.__file__).resolve().parent
SOURCES = ROOT / "onnx_lnfold"  # absent where the suite runs against an installed wheel
# Extras whose absence only makes their own module unimportable (pyproject's optional dependencies).
OPTIONAL_IMPORTS = {"onnx_lnfold.olive": "olive"}


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _modules(package_dir: Path) -> set[str]:
    return {
        ".".join(("onnx_lnfold", *p.relative_to(package_dir).with_suffix("").parts)).removesuffix(".__init__")
        for p in package_dir.rglob("*.py")
    }


def test_package_metadata():
    meta = _pyproject()
    project = meta["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]  # SPDX, PEP 639
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to read the SPDX form
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # forbidden beside SPDX
    assert "Programming Language :: Python :: 3" in project["classifiers"] and "onnx" in project["keywords"]
    assert project["scripts"]["onnx-lnfold"] == "onnx_lnfold.__main__:main"
    assert project["version"] == onnx_lnfold.__version__
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # Found, not listed: a new subpackage cannot be left out of the wheel.
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["onnx_lnfold", "onnx_lnfold.*"]


def test_every_module_of_the_installed_package_imports():
    names = sorted(name for _, name, _ in pkgutil.walk_packages(onnx_lnfold.__path__, "onnx_lnfold."))
    assert names == sorted(_modules(PACKAGE_DIR) - {"onnx_lnfold"})
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if OPTIONAL_IMPORTS.get(name) != (error.name or "").split(".")[0]:
                raise


@pytest.mark.skipif(os.environ.get("LNFOLD_TEST_INSTALLED") != "1", reason="the suite runs against the checkout")
def test_the_suite_runs_against_the_installed_wheel():
    """Set by .ci/run: the package imported is the one installed into site-packages, not a checkout."""
    assert PACKAGE_DIR.parent == Path(sysconfig.get_paths()["purelib"]).resolve()
    assert not SOURCES.exists()


@pytest.mark.skipif(not SOURCES.is_dir(), reason="no sources beside the tests: .ci/run built and checked the wheel")
def test_wheel_builds_cleanly_and_holds_every_module(tmp_path):
    """`pip wheel .` on a copy of the sources (the build writes beside them), with the
    environment's setuptools: no network, and the same warnings a user would see."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("needs setuptools >= 77 installed")
    src = tmp_path / "src"
    shutil.copytree(SOURCES, src / "onnx_lnfold", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp_path / "dist"), "--no-deps", "--no-build-isolation"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("onnx_lnfold-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    in_wheel = {n.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py")}
    assert in_wheel == _modules(SOURCES)
    # The package's data (the built-in cost table the cost rule reads) travels with it.
    data = {str(p.relative_to(SOURCES.parent)) for p in SOURCES.rglob("*.json")}
    assert data and data <= set(names)


def test_the_installed_package_reads_its_builtin_cost_table():
    """Wherever the package was installed from (a wheel in CI), its data file is there."""
    from onnx_lnfold.decide import costs

    table = costs.builtin_table()
    assert table.provider == "CPUExecutionProvider" and set(table.costs) == {*costs.KINDS, *costs.LAYOUT_KINDS}
