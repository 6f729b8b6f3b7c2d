#!/usr/bin/env python3
"""Writes the seed corpus of frame_decoder_fuzz into tests/fuzz/corpus/ (committed output).

Each seed is a TCP stream as a peer sends it: the 24-byte Hello, then frames of
LinkHeader {be32 frame_len, u8 version=2, u8 hdr_len, u8 flags, u8 0} + IB headers + payload
(flags: 0x01 datagram, 0x02 credit, whose 8 header bytes count consumed datagram bytes).
Destination QPNs and R_Keys are the harness's small indices (frame_decoder_fuzz.cpp):
QPN 0 RC responder, 1 RC requester (PSNs 0..3 outstanding: SEND, WRITE, READ 16 B,
FETCH_ADD), 2 RC in INIT, 3 UC, 4 UD (Q_Key 0x11111111), 5 RC on an SRQ, 6 none;
R_Key 0 = region at iova 0x10000 (4096 B, all rights), 1 = 0x20000 (64 B, read only),
2 = local region, 3 = no region.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

RC, UC, UD = 0x00, 0x20, 0x60
SEND_ONLY, SEND_ONLY_IMM, WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM = 0x04, 0x05, 0x06, 0x0A, 0x0B
READ_REQ, READ_RESP_ONLY, ACK, ATOMIC_ACK, CMP_SWAP, FETCH_ADD = 0x0C, 0x10, 0x11, 0x12, 0x13, 0x14
SEND_ONLY_INV = 0x17
RESPONDER, REQUESTER, SINK, UCQP, UDQP, SRQQP, NOQP = range(7)
QKEY = 0x11111111
IOVA0, IOVA1 = 0x10000, 0x20000
VERSION = 2
DATAGRAM, CREDIT = 0x01, 0x02


def hello(version=VERSION):
    return b"SRDM" + bytes([version, 0, 0, 0]) + bytes(range(0xE0, 0xF0))


def lrh(grh=False):
    return bytes([0, 3 if grh else 2]) + struct.pack(">HHH", 1, 0, 2)


def grh_hdr():
    sgid = bytes.fromhex("fe80000000000000") + bytes([127, 0, 0, 1, 0x12, 0x34, 0, 1])
    dgid = bytes.fromhex("fe80000000000000") + bytes([127, 0, 0, 1, 0x56, 0x78, 0, 2])
    return struct.pack(">IHBB", 6 << 28, 0, 0x1B, 64) + sgid + dgid


def bth(op, qpn, psn, ackreq=True):
    return struct.pack(">BBH", op, 0x40, 0xFFFF) + struct.pack(">I", qpn & 0xFFFFFF) + \
        struct.pack(">I", (0x80000000 if ackreq else 0) | (psn & 0xFFFFFF))


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


def atomic_eth(va, rkey, swap_add, compare):
    return struct.pack(">QIQQ", va, rkey, swap_add, compare)


def aeth(syndrome, msn=0):
    return bytes([syndrome]) + struct.pack(">I", msn)[1:]


def frame(ib, payload=b"", version=VERSION, flags=0):
    return struct.pack(">IBBBB", len(ib) + len(payload), version, len(ib), flags, 0) + ib + payload


def credit(consumed):
    return frame(struct.pack(">Q", consumed), flags=CREDIT)


def rc(op, qpn, psn, ext=b"", payload=b""):
    return frame(lrh() + bth(RC | op, qpn, psn) + ext, payload)


SEEDS = {
    # Requests to the RC responder.
    "rc_send_only": hello() + rc(SEND_ONLY, RESPONDER, 0, payload=b"hello, responder"),
    "rc_send_imm": hello() + rc(SEND_ONLY_IMM, RESPONDER, 0, b"\x01\x02\x03\x04", b"x" * 32),
    "rc_send_inv": hello() + rc(SEND_ONLY_INV, RESPONDER, 0, struct.pack(">I", 0), b"y" * 8),
    "rc_write_only": hello() + rc(WRITE_ONLY, RESPONDER, 0, reth(IOVA0 + 64, 0, 16), b"W" * 16),
    "rc_write_imm": hello()
    + rc(WRITE_ONLY_IMM, RESPONDER, 0, reth(IOVA0, 0, 8) + b"\xaa\xbb\xcc\xdd", b"I" * 8),
    "rc_write_first": hello() + rc(WRITE_FIRST, RESPONDER, 0, reth(IOVA0, 0, 8192), b"F" * 64),
    "rc_read": hello() + rc(READ_REQ, RESPONDER, 0, reth(IOVA0 + 8, 0, 64)),
    "rc_read_ro": hello() + rc(READ_REQ, RESPONDER, 0, reth(IOVA1, 1, 64)),
    "rc_cmp_swap": hello() + rc(CMP_SWAP, RESPONDER, 0, atomic_eth(IOVA0 + 16, 0, 7, 0)),
    "rc_fetch_add": hello() + rc(FETCH_ADD, RESPONDER, 0, atomic_eth(IOVA0 + 24, 0, 5, 0)),
    "rc_sequence": hello()
    + rc(WRITE_ONLY, RESPONDER, 0, reth(IOVA0, 0, 4), b"abcd")
    + rc(READ_REQ, RESPONDER, 1, reth(IOVA0, 0, 4))
    + rc(FETCH_ADD, RESPONDER, 2, atomic_eth(IOVA0 + 8, 0, 1, 0))
    + rc(SEND_ONLY, RESPONDER, 3, payload=b"s" * 20)
    + rc(WRITE_ONLY, RESPONDER, 3, reth(IOVA0, 0, 4), b"dupl"),
    "rc_psn_gap": hello() + rc(SEND_ONLY, RESPONDER, 5, payload=b"gap"),
    "rc_srq_send": hello() + rc(SEND_ONLY, SRQQP, 0, payload=b"srq" * 10),
    # Responses to the RC requester's outstanding PSNs 0..3.
    "rc_ack": hello() + rc(ACK, REQUESTER, 1, aeth(0x1F)),
    "rc_rnr_nak": hello() + rc(ACK, REQUESTER, 0, aeth(0x20 | 1)),
    "rc_nak_seq": hello() + rc(ACK, REQUESTER, 0, aeth(0x60)),
    "rc_nak_access": hello() + rc(ACK, REQUESTER, 1, aeth(0x62)),
    "rc_read_response": hello()
    + rc(ACK, REQUESTER, 1, aeth(0x1F))
    + rc(READ_RESP_ONLY, REQUESTER, 2, aeth(0x1F), b"R" * 16),
    "rc_atomic_ack": hello()
    + rc(ACK, REQUESTER, 1, aeth(0x1F))
    + rc(READ_RESP_ONLY, REQUESTER, 2, aeth(0x1F), b"R" * 16)
    + rc(ATOMIC_ACK, REQUESTER, 3, aeth(0x1F) + struct.pack(">Q", 41)),
    # UC and UD.
    "uc_send": hello() + frame(lrh() + bth(UC | SEND_ONLY, UCQP, 0, False), b"uc payload"),
    "uc_write": hello()
    + frame(lrh() + bth(UC | WRITE_ONLY, UCQP, 0, False) + reth(IOVA0 + 128, 0, 8), b"u" * 8),
    "ud_send": hello()
    + frame(lrh(True) + grh_hdr() + bth(UD | SEND_ONLY, UDQP, 0, False)
            + struct.pack(">II", QKEY, 0x77), b"datagram"),
    "ud_send_datagram": hello()
    + frame(lrh(True) + grh_hdr() + bth(UD | SEND_ONLY, UDQP, 0, False)
            + struct.pack(">II", QKEY, 0x77), b"counted" * 4, flags=DATAGRAM) * 3,
    "ud_send_imm": hello()
    + frame(lrh(True) + grh_hdr() + bth(UD | SEND_ONLY_IMM, UDQP, 0, False)
            + struct.pack(">II", QKEY, 0x77) + b"\x00\x00\x00\x2a", b"d" * 24),
    # A frame for no QP, then a truncated one.
    "unknown_qp": hello() + rc(SEND_ONLY, NOQP, 0, payload=b"nobody"),
    "truncated_payload": hello() + rc(WRITE_ONLY, RESPONDER, 0, reth(IOVA0, 0, 64), b"t" * 64)[:-30],
    # Malformed: the node drops the connection.
    "bad_link_version": hello() + rc(SEND_ONLY, RESPONDER, 0, payload=b"v")[:4] + b"\x01" +
    rc(SEND_ONLY, RESPONDER, 0, payload=b"v")[5:],
    "bad_hello": hello(1) + rc(SEND_ONLY, RESPONDER, 0, payload=b"v"),
    # Nothing was sent to this peer as a datagram: any credit is a lie.
    "bad_credit": hello() + credit(64) + rc(SEND_ONLY, RESPONDER, 0, payload=b"after"),
    "bad_flags": hello() + frame(lrh() + bth(RC | SEND_ONLY, RESPONDER, 0), b"f", flags=0x80),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {OUT}")


if __name__ == "__main__":
    main()
