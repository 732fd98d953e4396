"""A ggml rpc-server as a device (SPEC section 3, kind `rpc`): ggmlrun asks the live server,
over ggml's RPC protocol, for its version, alignment, largest buffer and memory. The server is
llama-cpp-python's libggml-rpc (ggml 0.25.3) serving this machine's CPU from a child process on
127.0.0.1, as scripts/llamacpp/record.py starts it; skipped, saying why, without it."""

import json
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from tests.clikit import invoke

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts" / "llamacpp")]
FIGURES = json.loads((REPO / "tests/data/llamacpp/figures.json").read_text())
TINY = REPO / "examples" / "models" / "tiny-llama-f16.gguf"


def _rpc_library() -> str | None:
    try:
        import importlib.util
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return "llama-cpp-python is not installed"
    if not (Path(spec.origin).parent / "lib" / "libggml-rpc.so.0").exists():
        return "llama-cpp-python was built without -DGGML_RPC=ON (no libggml-rpc)"
    return None


@pytest.fixture(scope="module")
def server():
    why = _rpc_library()
    if why:
        pytest.skip(why)
    import record as rec

    proc, endpoint = rec.start_rpc_server()
    try:
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


def backends_file(tmp_path, *devices: str) -> Path:
    path = tmp_path / "rpc.yaml"
    path.write_text("backends:\n" + "".join(f"  - {{name: RPC{i}, kind: rpc, endpoint: '{e}'}}\n"
                                            for i, e in enumerate(devices))
                    + "  - {name: CPU, kind: cpu, alignment: 32, threads: 2, repack: avx512}\n")
    return path


def test_the_server_says_what_it_is(server):
    from ggmlrun.core.backends.rpc import query

    info = query(server)
    assert info.version[0] == 7
    (dev,) = info.devices
    assert dev.alignment == 32 and 0 < dev.free <= dev.total and dev.max_size > 0


def test_a_live_rpc_device_gives_llamacpps_figures(server, tmp_path):
    """The RPC device asked of the server (alignment 32, no op offload) reproduces what
    llama.cpp recorded with such a server, as graphs/backends/llamacpp_rpc.yaml does."""
    cfg = next(c for c in FIGURES["configs"] if c["id"] == "tiny-llama-q8_0/c256/ub512/fa0/ngl2")
    code, out, err = invoke("measure", TINY.with_name(cfg["model"]), "--json", "--backends",
                            backends_file(tmp_path, server), "--ctx", "256", "--ubatch", "512",
                            "--ngl", "2", "--flash-attn", "off", "--parallel", "1")   # as recorded
    assert code == 0, err
    got = {b["name"]: b for b in json.loads(out)["backends"]}
    for name, want in cfg["backends"].items():
        assert {k: got[name][k] for k in want} == want
    assert f"--rpc {server}" in json.loads(out)["command"]


def test_fit_against_a_live_server_prints_the_rpc_line(server, tmp_path):
    code, out, err = invoke("fit", TINY, "--json", "--backends", backends_file(tmp_path, server))
    assert code == 0, err
    data = json.loads(out)
    assert data["ngl"] == 5 and f"--rpc {server}" in data["command"]
    rpc = data["backends"][0]
    from ggmlrun.core.backends.rpc import query
    assert 0 < rpc["memory_bytes"] <= query(server).devices[0].total


def test_two_rpc_devices_pipeline_parallel(server, tmp_path):
    """Two devices of one server (two endpoints in llama.cpp's --rpc would be two servers; the
    figures are the same): every layer offloaded turns pipeline parallelism on."""
    code, out, err = invoke("measure", TINY, "--json", "--backends",
                            backends_file(tmp_path, server, server), "--ctx", "256",
                            "--ubatch", "32", "--tensor-split", "1,1", "--flash-attn", "off",
                            "--parallel", "1")      # as recorded
    assert code == 0, err
    data = json.loads(out)
    assert data["n_copies"] == 4
    cfg = next(c for c in FIGURES["configs"] if c["id"] == "tiny-llama-f16/c256/ub32/fa0/nglall/ts1-1")
    assert [b["arena_bytes"] for b in data["backends"]] == [
        cfg["backends"][n]["arena_bytes"] for n in ("RPC0", "RPC1", "CPU")]


# --- without a server ----------------------------------------------------------------------
def _fake_server(answer):
    """A one-connection TCP server on 127.0.0.1 that reads a HELLO and replies `answer`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def serve():
        conn, _ = sock.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            if answer:
                conn.sendall(answer)
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{sock.getsockname()[1]}"


def test_another_protocol_version_is_named(tmp_path):
    endpoint = _fake_server(struct.pack("<Q", 28) + bytes([3, 0, 0, 0]) + bytes(24))
    code, _, err = invoke("validate", REPO / "graphs" / "mlp.yaml", "--backends",
                          backends_file(tmp_path, endpoint))
    assert code == 2 and "speaks ggml's RPC protocol 3.0.0; ggmlrun speaks 7.0.0" in err


def test_a_server_that_hangs_up_is_named(tmp_path):
    endpoint = _fake_server(b"")
    code, _, err = invoke("validate", REPO / "graphs" / "mlp.yaml", "--backends",
                          backends_file(tmp_path, endpoint))
    assert code == 2 and endpoint in err and "another protocol version" in err


def test_nothing_listening_is_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = invoke("validate", REPO / "graphs" / "mlp.yaml", "--backends",
                          backends_file(tmp_path, f"127.0.0.1:{port}"))
    assert code == 2 and "cannot connect" in err and "rpc.yaml" in err


@pytest.mark.parametrize("entry, words", [
    ("{name: R, kind: rpc}", "needs 'endpoint: host:port'"),
    ("{name: R, kind: rpc, endpoint: 'nohost'}", "write host:port"),
    ("{name: R, kind: rpc, endpoint: '127.0.0.1:1', alignment: 64}", "does not apply to an rpc"),
    ("{name: R, kind: sim, endpoint: '127.0.0.1:1'}", "applies to rpc backends only"),
])
def test_bad_rpc_entries(tmp_path, entry, words):
    path = tmp_path / "b.yaml"
    path.write_text(f"backends:\n  - {entry}\n  - {{name: CPU, kind: cpu}}\n")
    code, _, err = invoke("validate", REPO / "graphs" / "mlp.yaml", "--backends", path)
    assert code == 2 and words in err, err
