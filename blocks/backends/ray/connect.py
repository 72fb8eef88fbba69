"""
Why connecting to an external Ray cluster (``ray_address``) failed, in words that say what to do.

Ray raises ``ConnectionError("Failed to connect to Ray cluster at ...")`` for
every failed ``ray.init(address=...)``; the reason, when Ray knows it, is the
exception's cause. The common one with Ray 2.60: a cluster with token
authentication and a client that sends no token. ``ray start --head`` turns token authentication on
when ``~/.ray/auth_token`` exists, and a local ``ray.init()`` (``backend="ray"``
without ``ray_address``) writes that file; a client only sends the token when
``RAY_AUTH_MODE=token`` is set in its environment
(https://docs.ray.io/en/latest/ray-security/token-auth.html).

Ray also keeps the token it loaded for the life of the process: a process that
ran one Ray session and then connects to a cluster with another token sends the
old one, so each Ray session makes Ray read it again first
(:func:`~prefect_cudf_polars.blocks.backends.compat.reload_ray_auth_token`).
"""

from __future__ import annotations

import os

from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions


#: Ray 2.60 reports a refused token only as text: ``ConnectionError`` caused by
#: ``RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...
#: ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: ...")``.
_AUTH_FAILURE = "InvalidAuthToken"


class RayClusterError(RuntimeError):
    """The Ray cluster at ``ray_address`` could not be used; the message says what to do."""


def explain_connect_failure(address: str, exc: BaseException) -> RayClusterError:
    """
    Turn Ray's failure to connect to ``address`` into an error that says what to do.

    Parameters
    ----------
    address : str
        The block's ``ray_address``.
    exc : BaseException
        What ``ray.init(address=...)`` raised (usually ``ConnectionError``).

    Returns
    -------
    RayClusterError
        To raise ``from exc``. Its message names token authentication when
        ``exc`` or one of its causes mentions Ray's ``InvalidAuthToken``;
        otherwise it says nothing answered as a Ray cluster at ``address``.
    """
    if any(_AUTH_FAILURE in str(cause) for cause in iter_exceptions(exc)):
        return RayClusterError(
            f"The Ray cluster at {address} requires token authentication, and this process sent no valid token "
            f"(RAY_AUTH_MODE is {os.environ.get('RAY_AUTH_MODE', 'unset')}). Set RAY_AUTH_MODE=token in the flow "
            "run's environment (for a deployment: the work pool's or deployment's `env` job variable), with the "
            "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN. Note: `ray start --head` turns token "
            "authentication on by itself when ~/.ray/auth_token exists, which a local Ray (backend='ray' without "
            "ray_address) writes. See https://docs.ray.io/en/latest/ray-security/token-auth.html")
    return RayClusterError(
        f"Nothing answered as a Ray cluster at {address} ({type(exc).__name__}: {exc}). Check ray_address (host:port "
        "of the head's GCS, as `ray start --head` prints), that the head is running (`ray status --address ...`), and "
        "that this machine can reach it; or leave ray_address empty to start a local Ray for the session.")
