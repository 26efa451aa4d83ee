"""cri-resmgr-webhook: the resource-annotating mutating admission webhook, over TLS.

    cri-resmgr-webhook --tls-cert-file tls.crt --tls-private-key-file tls.key [--listen :8443]

Point a MutatingWebhookConfiguration (the Helm chart's webhook.yaml) at POST /mutate. Each
pod created gets the annotation intel.com/resources: the requests and limits of every
container and init container, as JSON. GET /healthz answers probes. The certificate and
key are read again when their files change (a rotated Secret), without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from dataclasses import dataclass

from aiohttp import web

from resmgr import __version__
from resmgr import log as logsetup
from resmgr.options import LOG_LEVELS, add_to, from_args, opt, positive_duration
from resmgr.webhook.review import BadReview, answer

log = logging.getLogger("cri-resmgr.webhook")

MAX_BODY = 8 << 20  # the API server sends at most a few MiB


def _listen(text: str) -> tuple[str | None, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"bad --listen {text!r} (use e.g. :8443 or 127.0.0.1:8443)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or None, int(port)


class Certificates:
    """The TLS context, reloaded when the certificate or key file changes."""

    def __init__(self, cert: str, key: str, interval: float = 30.0) -> None:
        self.cert, self.key, self.interval = cert, key, interval
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert, key)
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime

    def reload_if_changed(self) -> None:
        try:
            stamp = self._stamp()
            if stamp == self.stamp:
                return
            self.context.load_cert_chain(self.cert, self.key)  # new handshakes use it
        except (OSError, ssl.SSLError) as err:
            log.error("TLS certificate %s / key %s changed but cannot be loaded (%s); keeping the old one",
                      self.cert, self.key, err)
            return
        self.stamp = stamp
        log.info("TLS certificate reloaded from %s", self.cert)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.reload_if_changed()


async def mutate(request: web.Request) -> web.Response:
    if request.content_type != "application/json":
        return web.json_response({"error": "expected Content-Type application/json"}, status=415)
    body = await request.read()
    try:
        review = answer(body)
    except BadReview as err:
        log.warning("refused a request from %s: %s", request.remote, err)
        return web.json_response({"error": str(err)}, status=400)
    resp = review["response"]
    log.debug("AdmissionReview %s: %s", resp["uid"], "patched" if "patch" in resp else "unchanged")
    for warning in resp.get("warnings", []):
        log.warning("AdmissionReview %s: %s", resp["uid"], warning)
    return web.json_response(review)


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def app() -> web.Application:
    a = web.Application(client_max_size=MAX_BODY)
    a.router.add_post("/mutate", mutate)
    a.router.add_post("/", mutate)
    a.router.add_get("/healthz", health)
    return a


async def serve(host: str | None, port: int, certs: Certificates) -> None:
    runner = web.AppRunner(app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=certs.context, reuse_address=True)
    await site.start()
    log.info("cri-resmgr-webhook %s serving https on %s:%d", __version__, host or "*", port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = asyncio.create_task(certs.watch())
    await stop.wait()
    watch.cancel()
    await runner.cleanup()


@dataclass
class WebhookOptions:
    listen: tuple[str | None, int] = opt((None, 8443), "--listen", type=_listen, metavar="[HOST]:PORT",
                                         help="where to serve https (default: :8443, every interface)")
    tls_cert_file: str = opt("", "--tls-cert-file", required=True, metavar="FILE",
                             help="PEM certificate (chain) for the webhook's Service DNS name")
    tls_private_key_file: str = opt("", "--tls-private-key-file", required=True, metavar="FILE",
                                    help="its PEM private key")
    cert_check_interval: float = opt(30.0, "--cert-check-interval", type=positive_duration, metavar="DURATION",
                                     help="how often the certificate and key files are checked for changes "
                                          "(default: %(default)ss)")
    log_level: str = opt("INFO", "--log-level", choices=LOG_LEVELS, help="log level (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cri-resmgr-webhook", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(ap, WebhookOptions)
    ap.add_argument("--version", action="version", version=f"cri-resmgr-webhook {__version__}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = from_args(WebhookOptions, build_parser().parse_args(argv))
    logsetup.setup(args.log_level, [])
    try:
        certs = Certificates(args.tls_cert_file, args.tls_private_key_file, max(args.cert_check_interval, 0.1))
    except (OSError, ssl.SSLError) as err:
        print(f"cri-resmgr-webhook: cannot load the TLS certificate and key: {err}", file=sys.stderr)
        return 1
    host, port = args.listen
    try:
        asyncio.run(serve(host, port, certs))
    except OSError as err:
        print(f"cri-resmgr-webhook: cannot listen on {host or '*'}:{port}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
