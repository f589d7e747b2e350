"""An engine pod's HTTP port as discovery's engine probe meets it, for service_discovery_engine.rs.

`server_info_peer.py HOST PORT MODE [BODY_FILE]` serves, with Python's own http.server:
- `sglang BODY_FILE`: SGLang's `GET /server_info` (and the deprecated `/get_server_info`)
  answering the file's JSON, anything else 404;
- `vllm`: 404 for every path (vLLM has no server-info endpoint);
- `slow`: reads the request, then never answers;
- `huge`: answers 200 to `/server_info` and streams a body that never ends.
Prints `ready` once listening.
"""

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = open(sys.argv[4], "rb").read() if mode == "sglang" else b""


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if mode == "slow":
            time.sleep(3600)
            return
        if mode == "sglang" and self.path in ("/server_info", "/get_server_info"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode == "huge" and self.path == "/server_info":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            chunk = b'{"version":"0.5.23","page_size":16,"pad":"' + b"x" * 65536
            try:
                while True:
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return
        self.send_error(404)


server = ThreadingHTTPServer((host, port), Handler)
server.daemon_threads = True
print("ready", flush=True)
server.serve_forever()
