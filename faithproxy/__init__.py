"""faithproxy: an OpenAI-compatible proxy that checks a reasoning VLM's perception steps as they stream.

The repository keeps one folder per layer (faithcore/, clients/, detectors/, regenerators/, server/,
benchmarks/, benchmarks/tinyvlm/, benchmarks/shapesworld/); the install maps each of them under this one name
(`faithproxy.server`, `faithproxy.detectors`, ...: pyproject.toml, [tool.setuptools.package-dir]), so
nothing generic lands at the top of site-packages. This package itself holds only what sits above all
of them: the `faithproxy` command (cli.py), which assembles the subcommands each layer offers.
"""

__version__ = "0.1.0"
