"""The API server process: `python -m mlstack_testbed.node.api` serves TestbedPve on https://127.0.0.1:8006
(`testbed up` starts it)."""

import argparse
import asyncio
import logging
import signal

from .. import paths
from .backend import TestbedPve


async def serve(host: str, port: int) -> None:
    password = paths.API_PASSWORD_FILE.read_text().strip()
    pve = TestbedPve(password=password, host=host, port=port)
    for note in pve.load():
        logging.info(note)
    pve.save()
    # Tokens, roles and ACL as last saved; the testbed's own least-privilege token made when missing.
    pve.load_access()
    made = pve.ensure_provision_token()
    if made:
        logging.info(made)
    await pve.start(str(paths.API_CERT), str(paths.API_KEY))
    logging.info(
        "serving the PVE API on https://%s:%s (node %s, %d containers)", host, port, paths.NODE, len(pve.cts)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.info("stopping")
    pve.save()
    await pve.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="mlstack-testbed-api", description=__doc__)
    parser.add_argument("--host", default=paths.API_HOST)
    parser.add_argument("--port", type=int, default=paths.API_PORT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
