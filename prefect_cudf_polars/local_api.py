"""
Defaults for the temporary local API that Prefect starts where no Prefect API is configured.

With no ``PREFECT_API_URL`` (``python flow.py`` on a fresh machine), Prefect 3.9
starts a temporary server in a subprocess on a new SQLite database, and two of
its defaults make that first start print tracebacks:

* the server's telemetry service writes to the database while the first start is
  migrating it (``sqlite3.OperationalError: database is locked``) and needs the
  internet (``Failed to send telemetry``): here ``PREFECT_SERVER_ANALYTICS_ENABLED``
  defaults to ``false``;
* the first migration can take about 40 s on a small machine, longer than the 20 s
  Prefect waits for the server: here
  ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` defaults to ``120``.

A setting you made (an environment variable, the active profile, ``prefect.toml``,
``.env``) keeps its value, and with ``PREFECT_API_URL`` set (your own server,
Prefect Cloud, a worker's flow runs) nothing changes. The defaults are set as
environment variables of this process, which the temporary server inherits.
"""

from __future__ import annotations

import functools
import os

#: Setting name -> (where the setting lives in Prefect's settings, its field, the default here).
LOCAL_API_DEFAULTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": (("server",), "analytics_enabled", "false"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": (("server", "ephemeral"), "startup_timeout_seconds", "120"),
}


def apply_local_api_defaults() -> list[str]:
    """
    Set :data:`LOCAL_API_DEFAULTS` that nobody set, where Prefect would start its temporary API.

    Returns
    -------
    list of str
        The names of the settings set (empty with ``PREFECT_API_URL`` set, or where
        every one was set already).
    """
    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return []
    applied = []
    for name, (path, field, value) in LOCAL_API_DEFAULTS.items():
        if name not in os.environ and field not in functools.reduce(getattr, path, settings).model_fields_set:
            os.environ[name] = value
            applied.append(name)
    if applied:
        # Prefect reads its settings from the environment once, at `import prefect`; this
        # public function of prefect.context (Prefect 3.9.0, 3.9.1) reads them again, so the
        # start-up timeout applies in this process too.
        refresh_global_settings_context()
    return applied
