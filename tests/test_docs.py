"""Code says what it is, history lives in docs: algorithm docstrings carry no measurement logs (load
averages, dated runs), and every docs/algorithms page a docstring points to exists."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_algorithm_docstrings_point_to_their_measurements_and_carry_none():
    for path in sorted((ROOT / "pflbench" / "algorithms").glob("[!_]*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert not re.search(r"load average|20\d\d-\d\d-\d\d", doc), f"{path.name}: measurements go to docs/algorithms/"
        for page in re.findall(r"docs/algorithms/[\w-]+\.md", doc):
            assert (ROOT / page).is_file(), f"{path.name} points to {page}, which does not exist"
