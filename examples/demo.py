# A tour of the sandbox, from inside. Run it with:
#   go run ./cmd/pysandbox run examples/demo.py
import os
import socket
import statistics
import sys

print(f"Python {sys.version.split()[0]} running as uid {os.getuid()} on host {socket.gethostname()!r}")
print("what / holds:", sorted(os.listdir("/")))
print("processes visible:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
print("network interfaces:", [name for _, name in socket.if_nameindex()])

try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    print("connected to the host's port 22?!")
except OSError as e:
    print("host loopback unreachable:", e.strerror)

try:
    open("/usr/evil", "w")
except OSError as e:
    print("writing to /usr:", e.strerror)

with open("/work/data.txt", "w") as f:  # scratch space, gone after the run
    f.write("\n".join(str(x * x) for x in range(10)))
with open("/work/data.txt") as f:
    values = [int(line) for line in f]
print("mean of squares:", statistics.mean(values))

secrets = [k for k in os.environ if "TOKEN" in k or "KEY" in k or "SECRET" in k]
print("server secrets visible in the environment:", secrets or "none")
