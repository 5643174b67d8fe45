"""A stand-in for ``vllm-dyno agent`` of another version (tests/multinode/test_multinode.py): it says
a hello with ``--version`` (and ``--protocol``, default 1) and waits for its input to end, as an old install would."""
import json
import os
import socket
import sys

if __name__ == "__main__":
    version = sys.argv[sys.argv.index("--version") + 1]
    protocol = int(sys.argv[sys.argv.index("--protocol") + 1]) if "--protocol" in sys.argv else 1
    print(json.dumps({"op": "hello", "protocol": protocol, "version": version, "hostname": socket.gethostname(),
                      "pid": os.getpid(), "cards": [], "nvml": "none", "cpu": {}}), flush=True)
    sys.stdin.read()
