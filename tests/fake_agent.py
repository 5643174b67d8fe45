"""A stand-in for ``vllm-dyno agent`` of another version (tests/test_multinode.py): it says
a hello with ``--version`` and waits for its input to end, as an old install would."""
import json
import os
import socket
import sys

if __name__ == "__main__":
    version = sys.argv[sys.argv.index("--version") + 1]
    print(json.dumps({"op": "hello", "protocol": 1, "version": version, "hostname": socket.gethostname(),
                      "pid": os.getpid(), "cards": [], "nvml": "none", "cpu": {}}), flush=True)
    sys.stdin.read()
