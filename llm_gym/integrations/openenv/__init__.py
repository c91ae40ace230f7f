"""OpenEnv both ways: llm_gym environments served to any OpenEnv client, and any OpenEnv server
played as an llm_gym environment (the ``interop`` extra's ``openenv-core``).

* Serving (``llm-gym serve-env``): :func:`serve_env`, :class:`EnvServer` and
  :func:`build_env_app` (:mod:`.server`), one :class:`ServedEnv` per session (:mod:`.session`),
  every frame read first by the server's front door (:mod:`.guard`).
* Playing: :class:`RemoteEnv`, one episode over one WebSocket session (:mod:`.client`);
  :class:`RemoteTasks`, :class:`RemoteEnvFactory`, :func:`register_remote_env` and
  ``gym.make("OpenEnv-v0", base_url=...)`` (:func:`make_text_env`) (:mod:`.registration`).
* The wire format both sides speak and check: :class:`EnvAction` and :class:`EnvObservation`
  (:mod:`.protocol`).

Importing this package imports no OpenEnv code; each name below loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_gym.lazy import lazy_names

if TYPE_CHECKING:
    from llm_gym.integrations.openenv.client import RemoteEnv
    from llm_gym.integrations.openenv.protocol import EnvAction, EnvObservation
    from llm_gym.integrations.openenv.registration import (
        RemoteEnvFactory,
        RemoteTasks,
        make_text_env,
        register_remote_env,
    )
    from llm_gym.integrations.openenv.server import EnvServer, build_env_app, serve_env
    from llm_gym.integrations.openenv.session import ServedEnv

__all__ = [
    # serving
    "EnvServer",
    "ServedEnv",
    "build_env_app",
    "serve_env",
    # playing
    "RemoteEnv",
    "RemoteEnvFactory",
    "RemoteTasks",
    "make_text_env",
    "register_remote_env",
    # the wire format
    "EnvAction",
    "EnvObservation",
]

_MODULES = {
    "EnvServer": "server",
    "build_env_app": "server",
    "serve_env": "server",
    "ServedEnv": "session",
    "RemoteEnv": "client",
    "RemoteEnvFactory": "registration",
    "RemoteTasks": "registration",
    "make_text_env": "registration",
    "register_remote_env": "registration",
    "EnvAction": "protocol",
    "EnvObservation": "protocol",
}
"""The module of this package each name of ``__all__`` lives in."""


__getattr__, __dir__ = lazy_names(__name__, _MODULES, __all__)
