"""The stock tritonclient and python grpc over TLS and mutual TLS against a real
`mesh serve`, with a throwaway CA made here with openssl. The Rust tests
(router/tests/security.rs) cover reloads and every admin route; this checks that
stock clients interoperate."""
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Mesh


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path):
    """A CA, a server certificate for 127.0.0.1, a client certificate the CA signed,
    and a client certificate from another CA."""
    ext = d / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    cext = d / "client.ext"
    cext.write_text("subjectAltName=DNS:fraud-scorer\nextendedKeyUsage=clientAuth\n")
    for ca in ["ca", "other_ca"]:
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}", cwd=d)
    for name, ca, e in [("server", "ca", ext), ("client", "ca", cext), ("stranger", "other_ca", cext)]:
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", str(e), cwd=d)


def infer_over(client):
    x = np.zeros((1, 32), np.float32)
    inp = grpcclient.InferInput("input", [1, 32], "FP32")
    inp.set_data_from_numpy(x)
    p = client.infer("fraud_mlp", [inp]).as_numpy("probability")
    assert p.shape == (1, 1) and 0.0 <= p[0, 0] <= 1.0


def read(p: Path) -> bytes:
    return p.read_bytes()


def test_tritonclient_over_tls_and_mtls(tmp_path):
    make_pki(tmp_path)
    # TLS: any client that trusts the CA.
    cfg = tmp_path / "tls.toml"
    cfg.write_text(f'[tls]\ncert = "{tmp_path / "server.pem"}"\nkey = "{tmp_path / "server.key"}"\n')
    m = Mesh(ROOT / "examples" / "models", "--config", str(cfg))
    try:
        c = grpcclient.InferenceServerClient(m.grpc, ssl=True, root_certificates=str(tmp_path / "ca.pem"))
        assert c.is_server_live()
        infer_over(c)
        # Plain text against the TLS port fails.
        plain = grpcclient.InferenceServerClient(m.grpc)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
    finally:
        m.stop()

    # mTLS: the client must present a certificate the CA signed.
    cfg = tmp_path / "mtls.toml"
    cfg.write_text(
        f'[tls]\ncert = "{tmp_path / "server.pem"}"\nkey = "{tmp_path / "server.key"}"\n'
        f'client_ca = "{tmp_path / "ca.pem"}"\n'
    )
    m = Mesh(ROOT / "examples" / "models", "--config", str(cfg))
    try:
        good = grpcclient.InferenceServerClient(
            m.grpc, ssl=True, root_certificates=str(tmp_path / "ca.pem"),
            private_key=str(tmp_path / "client.key"), certificate_chain=str(tmp_path / "client.pem"))
        infer_over(good)
        none = grpcclient.InferenceServerClient(m.grpc, ssl=True, root_certificates=str(tmp_path / "ca.pem"))
        with pytest.raises(InferenceServerException):
            none.is_server_live(client_timeout=5)
        # python grpc with a certificate from another CA: refused.
        creds = grpc.ssl_channel_credentials(
            root_certificates=read(tmp_path / "ca.pem"),
            private_key=read(tmp_path / "stranger.key"),
            certificate_chain=read(tmp_path / "stranger.pem"))
        with grpc.secure_channel(m.grpc, creds) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        # ...and with the right one, python grpc gets answers too.
        creds = grpc.ssl_channel_credentials(
            root_certificates=read(tmp_path / "ca.pem"),
            private_key=read(tmp_path / "client.key"),
            certificate_chain=read(tmp_path / "client.pem"))
        with grpc.secure_channel(m.grpc, creds) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5).live
    finally:
        m.stop()
