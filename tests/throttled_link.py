"""A slow link to the test server: listens on 127.0.0.1 and relays each connection to the server's unix socket,
the bytes towards the server at most `rate` bytes/s per connection (a provider's uplink; a worker's checkpoint
upload is then seconds, its heartbeats and small writes, on their own connections, are not held behind it)."""
import socket
import threading
import time
from typing import Optional


class ThrottledLink:
    def __init__(self, target: str, rate: float) -> None:
        self.target, self.rate = target, rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return  # closed
            up = socket.socket(socket.AF_UNIX)
            up.connect(self.target)
            threading.Thread(target=pump, args=(down, up, self.rate), daemon=True).start()
            threading.Thread(target=pump, args=(up, down, None), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def pump(source: socket.socket, sink: socket.socket, rate: Optional[float] = None) -> None:
    """Relay until either side closes; with `rate`, each piece held as long as it takes at that many bytes/s."""
    try:
        while data := source.recv(16384):
            if rate is not None:
                time.sleep(len(data) / rate)
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.close()
            except OSError:
                pass
