"""The supervisor of `faithproxy serve --workers N`: uvicorn's, with this project's Server in each worker.

uvicorn's supervisor (`Multiprocess`) binds the socket, starts N workers and replaces one that dies;
what the workers share is in server/runtime/workers.py. Each worker runs server/runtime/uvicorn_server.py's Server,
which has no 100 ms housekeeping tick. The supervisor still asks every worker twice a second whether
it is alive (a thread of the worker answers on a pipe): two wake-ups a second where the tick made ten.

Its own module so that the app, which imports server/runtime/workers.py, never loads the supervisor.
"""

from __future__ import annotations

import uvicorn
from uvicorn.supervisors import multiprocess as supervisor

from faithproxy.server.runtime.uvicorn_server import Server


class _WorkerProcess(supervisor.Process):
    """One worker of uvicorn's supervisor, serving with server/runtime/uvicorn_server.py's Server. The
    supervisor pickles the worker (spawn), so this class is found by its module path in the new process."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = Server(config=self.config)
        return self._server


def run_workers(app: str, workers: int, **config: object) -> None:
    """uvicorn.run(app, factory=True, workers=N, **config), each worker with the tickless Server.

    uvicorn's supervisor (Multiprocess) makes its workers from the module global `Process` in three
    places (start, restart, replacing one that died), with no argument to name another class, so the
    supervisor's module is pointed at `_WorkerProcess` for this process, which does nothing else."""
    settings = uvicorn.Config(app, factory=True, workers=workers, **config)  # type: ignore[arg-type]
    sock = settings.bind_socket()
    supervisor.Process = _WorkerProcess  # type: ignore[misc]
    try:
        supervisor.Multiprocess(settings, sockets=[sock]).run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C while stopping
        pass
