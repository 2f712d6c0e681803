"""The abuse probes at CI size: each mitigation bounds its attack.

Run by CTest (abuse_probes) with $ROLLPACKD; by hand:
    ROLLPACKD=build/bin/rollpackd /usr/bin/python3 -m unittest -v test_abuse
from tests/abuse. Sizes are small versions of rollpack_abuse.py's; the
bounds sit between what the protected and the unprotected server hold.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import message_probes  # noqa: E402
import transport_probes  # noqa: E402

MB = 1 << 20


def binary():
    path = os.environ.get("ROLLPACKD") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin", "rollpackd")
    if not os.access(path, os.X_OK):
        raise AssertionError("%s is not an executable rollpackd (set $ROLLPACKD)" % path)
    return path


class AbuseTest(unittest.TestCase):
    def test_compressed_requests_are_refused_before_inflating(self):
        with harness.Server(binary()) as server:
            figures = message_probes.compressed_bomb(server, inflated_bytes=256 * MB)
        self.assertEqual(figures["code"], "UNIMPLEMENTED", figures)
        self.assertIn("gzip", figures["details"])
        # Inflated, the request alone would be 256 MB.
        self.assertLess(figures["peak_rss_mb"], 100, figures)
        self.assertTrue(figures["normal_client_after"]["ok"], figures)

    def test_requests_beyond_the_transport_quota_are_not_buffered(self):
        # 8 x 40 MB without a token: 320 MB if all were held (measured peaks:
        # ~250 MB unprotected, ~110 MB with the quota).
        args = ["--max-message-bytes", str(48 * MB), "--transport-memory", str(64 * MB)]
        with harness.Server(binary(), args, auth=True) as server:
            figures = message_probes.oversized_unauthenticated(
                server, calls=8, request_bytes=40 * MB)
        self.assertTrue(figures["server_alive"], figures)
        self.assertLess(figures["peak_rss_mb"], 180, figures)
        self.assertTrue(figures["normal_client_after"]["ok"], figures)
        self.assertEqual(set(figures["codes"]) - {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED",
                                                  "UNAVAILABLE"}, set(), figures)

    def test_stalled_uploads_are_bounded_by_the_transport_quota(self):
        # 4 streams x 48 MB sent of a declared 64 MB message: 192 MB if held
        # (measured peaks: ~215 MB unprotected, ~110 MB with the quota).
        args = ["--max-message-bytes", str(64 * MB), "--transport-memory", str(64 * MB)]
        with harness.Server(binary(), args) as server:
            figures = transport_probes.stalled_put(
                server, streams=4, declared_bytes=64 * MB, send_bytes=48 * MB, hold_seconds=4)
        self.assertTrue(figures["server_alive"], figures)
        self.assertLess(figures["peak_rss_mb"], 170, figures)
        self.assertGreater(sum(figures["resets"].values()) + sum(figures["goaways"].values()), 0,
                           figures)

    def test_mutual_tls_refuses_a_rapid_reset_flood_at_the_handshake(self):
        with harness.Server(binary(), mutual_tls=True) as server:
            figures = transport_probes.rapid_reset(server, seconds=2, connections=2,
                                                   settle_seconds=2)
        self.assertEqual(figures["streams_opened"], 0, figures)
        self.assertLess(figures["peak_rss_mb"], 100, figures)
        self.assertEqual(figures["normal_client_after"]["failed"], 0, figures)
        self.assertGreater(figures["normal_client_after"]["calls"], 0, figures)

    def test_sigterm_stops_within_the_grace_period_after_a_flood(self):
        # On plaintext gRPC 1.51 takes the flood in; the stop stays bounded
        # by --shutdown-grace-seconds + 10 s however long gRPC would drain.
        with harness.Server(binary(), ["--shutdown-grace-seconds", "1"]) as server:
            figures = transport_probes.rapid_reset(server, seconds=2, connections=2,
                                                   settle_seconds=1)
        self.assertGreater(figures["streams_opened"], 0, figures)
        self.assertIsNotNone(figures["sigterm_seconds"], figures)
        self.assertLess(figures["sigterm_seconds"], 1 + 10 + 2, figures)


if __name__ == "__main__":
    unittest.main()
