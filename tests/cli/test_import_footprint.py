"""The command line loads only what planning uses: no pandas, scipy, plotting, Parquet, Dask or
torch on ``import cli.main`` or on a plan from presets (they cost most of a plan's wall time)."""

import subprocess
import sys

from tests.test_architecture import ROOT

HEAVY = ("pandas", "scipy", "matplotlib", "pyarrow", "dask", "torch")

_PROBE = """
import sys
{body}
heavy = [m for m in {heavy!r} if m in sys.modules]
print("heavy:" + ",".join(heavy), file=sys.__stderr__)
"""


def _heavy_modules(body: str) -> list[str]:
    code = _PROBE.format(body=body, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("heavy:"), out.stderr
    return [m for m in line[len("heavy:"):].split(",") if m]


def test_import_of_the_command_line_loads_no_heavy_package():
    assert _heavy_modules("import cli.main") == []


def test_a_plan_from_presets_loads_no_heavy_package():
    body = ("import contextlib, io\nfrom cli.main import main\n"
            "sys.argv = ['plan', '--model', 'llama3.1-8b', '--cluster', 'dgx-h100', "
            "'--gpus', '64', '--top', '1']\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main()")
    assert _heavy_modules(body) == []
