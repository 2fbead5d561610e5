"""The attacker of hostile.py: a separate process that floods an engine's topics at a steady rate.

It publishes mixed hostile traffic on every topic the engine subscribes to (``cmd`` and each
worker's ``birth``, ``hb`` and ``death``): unsigned commands, commands signed with another secret
or with a made-up signature, malformed JSON, payloads of the wrong kind or schema version, fields out
of range and oversized payloads. QoS 1 where the engine subscribes at QoS 1 (commands, births,
deaths: the engine acknowledges each), QoS 0 on heartbeats. Paced in 5 ms steps so the rate holds
without bursts; raw paho (no asyncio), so the sender's own cost stays small and is measured.

It also listens to the engine's events topic and counts what it hears, by (what, subject) and by
second, so the benchmark can show that refusals are told in summaries.

Lines on stdout (JSON): ``{"ready": true, "pid": ...}`` once connected and flooding; when stdin
closes, ``{"sent": ..., "seconds": ..., "cpu_s": ..., "events": ..., "events_by_key": ..., "told_by_key": ...,
"times_by_key": ...}`` (for refusals and drops: their counts added up, and the engine's stamps).

    python benchmarks/_hostile_flood.py --port P --pipeline NAME [--rate 5000] [--seed 7]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from typing import Any

import paho.mqtt.client as mqtt

STEP_S = 0.005
SUMMARISED = ("command_refused:", "message_dropped:")
MIX = {
    "cmd_unsigned": 10, "cmd_bad_sig": 10, "cmd_other_secret": 10, "cmd_malformed": 8, "cmd_wrong_kind": 5,
    "cmd_oversized": 1, "worker_malformed": 15, "worker_wrong_kind": 10, "worker_unknown_kind": 8,
    "worker_version": 8, "worker_out_of_range": 10, "worker_oversized": 1, "worker_deep_json": 4,
}
"""Each kind of hostile message, with its weight in the mix."""


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _signed(secret: bytes, body: str, rng: random.Random) -> bytes:
    ts, nonce = time.time(), _hex(rng, 32)
    sig = hmac.new(secret, f"{ts!r}\n{nonce}\n{body}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"kind": "cmd", "v": 1, "ts": ts, "nonce": nonce, "body": body, "sig": sig}).encode()


def make_messages(base: str, n: int, rng: random.Random) -> list[tuple[str, bytes, int]]:
    """``n`` hostile (topic, payload, qos) messages in the MIX's proportions, shuffled."""
    cmd = f"{base}/cmd"
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=n)
    out: list[tuple[str, bytes, int]] = []
    for i, kind in enumerate(kinds):
        wid = f"ghost-{rng.randrange(1000)}"
        if kind == "cmd_unsigned":
            out.append((cmd, json.dumps({"kind": "cancel", "all": True, "i": i}).encode(), 1))
        elif kind == "cmd_bad_sig":
            body = '{"kind":"pause"}'
            out.append((cmd, json.dumps({"kind": "cmd", "v": 1, "ts": time.time(), "nonce": _hex(rng, 32),
                                         "body": body, "sig": _hex(rng, 64)}).encode(), 1))
        elif kind == "cmd_other_secret":
            out.append((cmd, _signed(b"a guessed secret, long enough", '{"kind":"drain"}', rng), 1))
        elif kind == "cmd_malformed":
            out.append((cmd, rng.randbytes(rng.randrange(1, 200)), 1))
        elif kind == "cmd_wrong_kind":
            out.append((cmd, json.dumps({"kind": "hb", "v": 1, "worker": wid, "epoch": 1, "seq": 0,
                                         "progress": 0}).encode(), 1))
        elif kind == "cmd_oversized":
            out.append((cmd, b'{"kind":"cmd","body":"' + b"A" * 20_000 + b'"}', 1))
        else:
            which = rng.choice(["hb", "birth", "death"])
            topic, qos = f"{base}/worker/{wid}/{which}", 0 if which == "hb" else 1
            if kind == "worker_malformed":
                payload = b'{"kind": "' + which.encode() + b'", "worker": '
            elif kind == "worker_wrong_kind":
                payload = json.dumps({"kind": "engine_state", "v": 1, "state": "online", "pipeline": "x"}).encode()
            elif kind == "worker_unknown_kind":
                payload = json.dumps({"kind": rng.choice(["nope", "HB", 7, None]), "v": 1}).encode()
            elif kind == "worker_version":
                payload = json.dumps({"kind": which, "v": 2, "worker": wid, "epoch": 1}).encode()
            elif kind == "worker_out_of_range":
                payload = json.dumps({"kind": which, "v": 1, "worker": wid, "epoch": -1, "seq": 999,
                                      "progress": -5, "interval_s": 1e9}).encode()
            elif kind == "worker_oversized":
                payload = b'{"kind":"hb","pad":"' + b"A" * 70_000 + b'"}'
            else:  # worker_deep_json
                payload = b"[" * 3000 + b"]" * 3000
            out.append((topic, payload, qos))
    return out


class Listener:
    """Counts the engine's events by (what, subject); for refusals and drops also adds up their counts
    and keeps the engine's stamps (``t``) of each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: Counter[str] = Counter()
        self.told: Counter[str] = Counter()
        self.times: dict[str, list[float]] = {}
        self.total = 0

    def on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            ev = json.loads(msg.payload)
            key, t, count = f"{ev['what']}:{ev['subject']}", float(ev["t"]), int(ev.get("count", 0))
        except (ValueError, KeyError, TypeError):
            key, t, count = "unreadable", 0.0, 0
        with self.lock:
            self.total += 1
            self.by_key[key] += 1
            if key.startswith(SUMMARISED):
                self.told[key] += count
                self.times.setdefault(key, []).append(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--rate", type=float, default=5000.0, help="messages per second")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    base = f"warpdeck/{args.pipeline}"
    messages = make_messages(base, 4000, random.Random(args.seed))

    listener = Listener()
    lc = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="wd-hostile-listener")
    lc.on_message = listener.on_message
    lc.connect("127.0.0.1", args.port, keepalive=30)
    lc.subscribe(f"{base}/events", qos=1)
    lc.loop_start()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="wd-hostile-flood")
    c.max_inflight_messages_set(1000)  # the attacker's QoS-1 sends are never held back by our own window
    c.connect("127.0.0.1", args.port, keepalive=30)
    c.loop_start()

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()

    t0, cpu0 = time.monotonic(), time.process_time()
    sent, n = 0, len(messages)
    while not stop.is_set():
        owed = int((time.monotonic() - t0) * args.rate) - sent
        for _ in range(owed):
            topic, payload, qos = messages[sent % n]
            c.publish(topic, payload, qos=qos)
            sent += 1
        stop.wait(STEP_S)
    seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    c.loop_stop()
    c.disconnect()
    lc.loop_stop()
    lc.disconnect()
    with listener.lock:
        doc = {"sent": sent, "seconds": seconds, "cpu_s": cpu, "events": listener.total,
               "events_by_key": dict(listener.by_key), "told_by_key": dict(listener.told),
               "times_by_key": listener.times}
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
