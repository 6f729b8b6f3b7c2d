// Where the next payload byte of an inbound frame goes: walks the RxTarget's segments as bytes
// arrive in pieces. Bytes beyond the last segment are discarded (the sink asked for no more).
#pragma once

#include <algorithm>
#include <cstring>

#include "link/link.h"
#include "link/placement_guard.h"

namespace softrdma::link {

struct RxCursor {
  int seg = 0;
  size_t off = 0;

  void Deliver(RxTarget& t, const uint8_t* src, size_t n) {
    while (n > 0 && seg < t.nseg) {
      iovec& s = t.seg[seg];
      size_t c = std::min(n, s.iov_len - off);
      if (c && !PlaceGuarded(static_cast<uint8_t*>(s.iov_base) + off, src, c)) t.refused = true;
      src += c;
      n -= c;
      Step(t, c);
    }
  }

  // Moves past `n` bytes that arrived in place (read straight into the segments).
  void Advance(const RxTarget& t, size_t n) {
    while (n > 0 && seg < t.nseg) {
      size_t c = std::min(n, t.seg[seg].iov_len - off);
      n -= c;
      Step(t, c);
    }
  }

 private:
  void Step(const RxTarget& t, size_t c) {
    off += c;
    if (off == t.seg[seg].iov_len) {
      ++seg;
      off = 0;
    }
  }
};

}  // namespace softrdma::link
