import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests that export models with torch")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: needs torch, minutes or GBs; run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
