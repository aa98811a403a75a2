"""The daemon's configuration: one pydantic-settings tree, a YAML file plus GOVERNOR_* overrides.

`load_settings(path)` validates a file into `Settings` or raises `ConfigError` listing every problem
(file:line: field: what is wrong). The package, by module:

- `settings.py`: `Settings`, the tree's root, its cross-field checks and its views (`fleet_spec()`,
  `engines()`, `summary()`);
- `sections.py`: the sections under it (telemetry, pools, SLOs, actuators, API, guards, leader
  election, OpenTelemetry); `prometheus.py` the Prometheus connection; `catalogue.py` the declared
  models and SKUs and each pool's engine;
- `loading.py`: YAML and the environment → `Settings`, with each problem's file and line;
- `checks.py`: what pydantic's field types do not check (strict scalars, the file's size, auth);
- `errors.py`: `ConfigError`;
- `tick_budget.py`: each phase's deadline inside the tick, from the configured timeouts.

`deploy/governor.example.yaml` documents every key (a test loads it). Nothing in this package opens
sockets or starts anything; it reads only the config file, the environment and (when asked) token
files.
"""

from controller.config.checks import is_loopback
from controller.config.errors import ConfigError
from controller.config.loading import cmd_schema, load_settings, parse_settings
from controller.config.settings import Settings

__all__ = ["ConfigError", "Settings", "cmd_schema", "is_loopback", "load_settings", "parse_settings"]
