// The InfiniBand QP state machine as seen by ibv_modify_qp(): which state transitions exist for
// which QP type, and which attribute-mask bits each transition requires or accepts.
//
// This is a pure rule table (IBA Vol 1 chapter 11, "Modify QP"; cross-checked against what the
// Linux kernel's ib_modify_qp_is_ok() accepts, so that programs that work on real hardware work
// here). It does not look at attribute values, only at states and mask bits.
#pragma once

#include <infiniband/verbs.h>

namespace softrdma::core {

// Returns 0 if ibv_modify_qp() on a QP of `type` that is currently in `cur` with `attr_mask` is a
// legal request, else EINVAL.
//
// `next` is attr->qp_state when (attr_mask & IBV_QP_STATE), else it must equal `cur` (modifying
// attributes in place is the cur->cur transition; a caller passing next != cur without
// IBV_QP_STATE gets EINVAL).
//
// `claimed_cur` is attr->cur_qp_state and is only looked at when attr_mask has IBV_QP_CUR_STATE.
// Rules for IBV_QP_CUR_STATE:
//  * The claim must equal `cur` exactly. Our QP state is authoritative (there is no hardware that
//    moves asynchronously behind the driver's back), and the attribute exists so a consumer can
//    say "I know the QP is in X": claiming RTS while the QP has dropped to SQE (or the reverse)
//    is refused, which is how the consumer learns of the asynchronous transition instead of
//    silently modifying a QP in a state it did not expect. (Kernel drivers instead use the claim
//    as the current state and let the hardware reject a mismatch; the outcome is the same.)
//  * The bit itself is only accepted on the transitions where the IBA lists it as optional:
//    RTR->RTS, RTS->RTS, SQD->RTS, SQE->RTS, for RC/UC/UD/XRC (not RAW_PACKET). Anywhere else,
//    e.g. INIT->RTR or RTS->ERR, it is EINVAL like any other disallowed bit.
//
// Unknown QP types (including IBV_QPT_DRIVER), out-of-range states and IBV_QPS_UNKNOWN are EINVAL.
int CheckQpTransition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
                      ibv_qp_state claimed_cur);

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"; "INVALID" for values outside the
// enum. Never returns null. For diagnostics only.
const char* QpStateName(ibv_qp_state state);

}  // namespace softrdma::core
