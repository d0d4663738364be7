"""`qwenc serve`: an OpenAI-compatible HTTP server over the batching engine.

    pip install "qwenc[server]"
    qwenc serve -m model.gguf --port 8000

The app itself is `qwenc.server.app.create_app(engine)`; `serve()` runs it on uvicorn and makes
SIGTERM / Ctrl-C a graceful stop: no new requests, running ones finish (within the grace period,
then end with finish_reason "length"), then the process exits 0.
"""
import logging

log = logging.getLogger("qwenc.server")


def make_server(engine, host: str = "127.0.0.1", port: int = 8000, model_name: str = None,
                api_key: str = None, grace: float = 30.0, cors_origins=None, max_body_bytes: int = None,
                log_level: str = "info", ready=None):
    """A uvicorn.Server for `engine` (call .run(); set .should_exit to stop). `ready`, if given,
    is called with the bound (host, port) once it listens (port 0 picks a free one)."""
    import uvicorn

    from .app import MAX_BODY_BYTES, create_app

    app = create_app(engine, model_name, api_key, max_body_bytes or MAX_BODY_BYTES, cors_origins)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # Stop taking requests at once and give the running ones `grace` seconds; uvicorn then
            # waits for their responses to end before it exits.
            if not self.should_exit:
                log.info("stopping: finishing running requests (grace %.0f s)", grace)
                engine.shutdown(grace=grace, wait=False)
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful stop (so the exit status says
            # "killed"); a graceful stop is a normal end here, and exits 0
            self._captured_signals.clear()

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if ready is not None and self.servers:
                sock = self.servers[0].sockets[0]
                ready(sock.getsockname()[:2])

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=grace + 5, server_header=False)
    server = _Server(config)
    server.app = app
    return server


def serve(engine, host: str = "127.0.0.1", port: int = 8000, **kwargs) -> int:
    """Serve until SIGTERM / Ctrl-C; returns the exit status (0 after a graceful stop)."""
    server = make_server(engine, host, port, **kwargs)
    server.run()
    engine.shutdown(grace=0)
    return 0

