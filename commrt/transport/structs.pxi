# Wire format and the C structures of the engine.
#
# Every message, over a ring or a socket, starts with the same 64-byte
# header.  A shared-memory record is the header, then the payload, padded to
# 64 bytes; a TCP frame is the header then the payload.
#
#   opcode  meaning                         payload           fields used
#   EAGER   a whole small message           the message       nbytes, meta, tag
#   RTS     "I have a large message"        none              nbytes, cookie=send id, addr=send buffer
#   CTS     "matched: send the data"        none              cookie=send id, addr=recv id
#   DATA    (part of) a large message       nbytes bytes      cookie=recv id, addr=offset
#   FIN     "copied it myself" (CMA)        none              cookie=send id
#   ABORT   poison a context                reason text       ctx, meta=failure code,
#                                                             tag=culprit, addr=origin rank,
#                                                             cookie=1: ctx ^ 1 as well
#   BYE     orderly close                   none
#   PAD     skip to the ring's start        (ring only)
#   CREDIT  return eager credit             none              credit
#   BEAT    "I am alive" (TCP heartbeat)    none
#
# Every frame carries `credit`: bytes of eager credit its sender hands back
# (flow control, see engine.pxi), so credit rides on traffic going the other
# way and CREDIT is sent only when none does.

cdef enum:
    HDR_MAGIC = 0x4D43              # "CM" little-endian
    HDR_VERSION = 3                # 2: 64-byte header with credit and meta2, CREDIT and BEAT;
                                   # 3: split copies (CTS_SPLIT, FIN_SPLIT: shm.pxi)
    HDR_SPACE = 64                  # header slot in a ring record (the whole header)
    REC_ALIGN = 64

cdef enum:
    PUSH_WRITTEN = 0        # chan_push_fn: written, the send is complete
    PUSH_REFUSED = 1        # the receiver took the request back: wait (an abort or loss follows)
    PUSH_FAILED = 2         # not permitted: stream it (CTS/DATA) instead
    PUSH_SPLIT = 3          # our part of a split copy is written: wait for the receiver's FIN
    CTS_PUSH = 1            # CTS meta: "write it yourself" (slot in meta >> 8, address in meta2)
    CTS_SPLIT = 2           # CTS meta: "write the bytes from nbytes on; I read the rest" (shm.pxi)
    FIN_PUSHED = 2          # FIN meta (to the receiver): the push of receive `cookie` is written
    FIN_SPLIT = 3           # FIN meta (to the receiver): its split's second part is written

cdef enum:
    COPIER_AUTO = 0
    COPIER_RECEIVER = 1
    COPIER_SENDER = 2
    COPIER_EXCHANGE = 3

cdef enum:
    OP_EAGER = 1
    OP_RTS = 2
    OP_CTS = 3
    OP_DATA = 4
    OP_FIN = 5
    OP_ABORT = 6
    OP_BYE = 7
    OP_PAD = 8
    OP_CREDIT = 9
    OP_BEAT = 10
    OP_MAX = 10

# request kinds and states
cdef enum:
    K_SEND = 1
    K_RECV = 2

cdef enum:
    S_NEW = 0
    S_PENDING = 1       # posted, not matched (recv) or not yet handed over (send)
    S_ACTIVE = 2        # matched; data moving
    S_DONE = 3
    S_ERROR = 4

# error codes carried by a failed request
cdef enum:
    E_NONE = 0
    E_TRUNC = 1
    E_PEER_LOST = 2
    E_ABORTED = 3
    E_CLOSED = 4        # the peer closed its communicator
    E_SILENT = 5        # peer lost: no heartbeat within the liveness timeout
    E_SHUTDOWN = 6      # this rank closed its communicator with the request pending
    E_CANCELLED = 7     # Request.cancel() unposted it before it matched

# An ABORT's fields come off the wire: each is checked (abort_fields_ok, engine.pxi)
# before anything is poisoned.  The codes are commrt.errors.FailureCode's (ABORTED
# .. ERROR; tests/comm/test_errors.py holds the two together).
cdef enum:
    FAILURE_CODE_MIN = 1
    FAILURE_CODE_MAX = 5
    ABORT_TEXT_MAX = 255            # reason bytes an ABORT may carry (Engine.abort cuts to it)

cdef enum:
    MIN_CREDIT = 65536              # smallest credit a rank may grant a peer (COMMRT_UNEXPECTED_BYTES)
    MSG_COST = 256                  # credit an EAGER or RTS costs beyond its payload: what an
                                    # unexpected message's bookkeeping takes (umsg_t, rounding)
    POOL_UNIT = 256                 # unexpected-message blocks come in steps of this size
    POOL_BUCKETS = 160              # blocks up to 40 KiB are pooled

# epoll tags: (kind << 32) | rank
cdef enum:
    EV_PEER = 1         # a peer's channel fd (its socket; a shm pair's liveness socket)
    EV_DOORBELL = 3
    EV_KICK = 4
    EV_IO = 5
    EV_LANE = 6         # an extra TCP stream: (EV_LANE << 32) | (lane << 24) | rank

# A reduce-receive's combine step: dst[i] = dst[i] OP src[i] for n elements
# (any C function of this shape; the transport does not know what it computes).
ctypedef void (*combine_fn)(void *dst, const void *src, int64_t n) noexcept nogil


cdef inline bint combinable_size(int itemsize) noexcept nogil:
    """An element size a reduce-receive can take: it divides 64, so no streamed
    chunk (a multiple of 64 bytes, see Engine.__cinit__) splits an element."""
    return 0 < itemsize <= 64 and 64 % itemsize == 0

cdef struct hdr_t:          # 64 bytes, little-endian, no padding (docs/transport.md)
    uint16_t magic
    uint8_t version
    uint8_t opcode
    int32_t src
    uint32_t ctx
    int32_t tag
    uint32_t seq
    uint32_t credit     # eager credit (bytes) the sender of this frame returns to its receiver
    uint64_t nbytes
    uint64_t meta       # the layer above's fingerprint, two words (collectives: sequence,
    uint64_t meta2      # kind, algorithm, count, dtype, op, root); the transport compares, never parses
    uint64_t cookie
    uint64_t addr

cdef struct req_t:
    int kind
    int state
    int peer            # send: destination; recv: source filter (-1 any)
    uint32_t ctx
    int tag             # send: tag; recv: tag filter (-1 any)
    char *buf
    uint64_t cap        # bytes in buf
    uint64_t nbytes     # bytes of the message
    uint64_t moved      # bytes delivered so far (streamed DATA)
    uint64_t meta
    uint64_t meta2
    uint64_t id
    int st_src
    int st_tag
    int err
    uint64_t err_a      # error detail (message bytes for E_TRUNC)
    int err_rank
    req_t *next         # posted / per-peer list links
    req_t *prev
    req_t *done_next    # completion list (swept by Python)
    void *pyobj         # the Request object that owns this struct
    bint user_visible   # completion should wake the progress thread's waiters
    bint held           # a send whose EAGER/RTS frame waits for credit (peer_t.held)
    bint persistent     # owned by an ExchangeChain: not put on the completion list
    # recv only: which process copies a large shared-memory message, where
    # process_vm_readv/writev are permitted (the layer above knows whose core
    # has other copies to make; the transport alone would stream it through
    # the ring below cma_min, both cores copying):
    #   COPIER_RECEIVER: this rank reads it from the sender's buffer whatever
    #     its size where ranks share cores (a scatter's receivers: the root's
    #     core copies nothing for them)
    #   COPIER_EXCHANGE: the same, and with a core per rank from cma_min / 4
    #     up: half of an exchange, in which this rank's core also streams what
    #     it sends (an all-to-all's, an all-gather's receives)
    #   COPIER_SENDER: the sender writes it into this buffer (a gather's root:
    #     its core copies only its own block, the senders theirs), shm.pxi's
    #     push slots keeping the write from ever landing after the receive failed;
    #     a reduce-receive streams (the sender's core copies into the ring while
    #     this one combines: a reduce's root) unless ranks outnumber cores
    int copier
    int slot            # a push armed for it: its slot + 1 (0: none)
    uint64_t split_at   # a split copy (shm.pxi): where the sender's part begins (0: none)
    uint64_t split_cookie   # ... and the sender's send id, for the FIN once both parts are in
    bint lent           # failed while its sender may still be writing into buf:
                        # the Request keeps buf alive for good (Engine._sweep)
    # reduce-receive (recv only): the payload is combined into buf by hook, in
    # pieces of whole elements, instead of copied -- and only when it is the
    # message expected (meta == want_meta, nbytes == cap); any other leaves buf
    # untouched and completes with its own meta and size in the status
    combine_fn hook
    uint32_t itemsize
    uint64_t want_meta
    uint64_t want_meta2

cdef struct eng_t
cdef struct peer_t

# Channel operations: everything the engine asks of a peer's channel, one
# table per kind of channel (self, shm.pxi, tcp.pxi).  The engine never
# branches on the kind: it calls p.ops.  A new transport is one .pxi file
# that defines these functions and its chan_ops_t, included in _core.pyx,
# plus the Engine.add_*_peer method that adopts its channels (the
# registration).  NULL entries: the channel has no such step.
ctypedef void (*chan_flush_fn)(eng_t *E, peer_t *p) noexcept nogil
ctypedef bint (*chan_put_fn)(eng_t *E, peer_t *p, hdr_t *h, const char *payload,
                             uint64_t plen) noexcept nogil
ctypedef int (*chan_poll_fn)(eng_t *E, peer_t *p) noexcept nogil
ctypedef void (*chan_event_fn)(eng_t *E, peer_t *p, uint32_t events) noexcept nogil
ctypedef void (*chan_arm_fn)(peer_t *p, uint32_t value) noexcept nogil
ctypedef bint (*chan_pull_fn)(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil
ctypedef int (*chan_push_fn)(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil
ctypedef void (*chan_disarm_fn)(eng_t *E, peer_t *p, req_t *r) noexcept nogil
ctypedef void (*chan_post_fn)(eng_t *E, req_t *s) noexcept nogil
ctypedef void (*chan_beat_fn)(eng_t *E, peer_t *p) noexcept nogil
ctypedef uint64_t (*chan_heard_fn)(peer_t *p) noexcept nogil
ctypedef uint64_t (*chan_mem_fn)(peer_t *p) noexcept nogil
ctypedef void (*chan_release_fn)(peer_t *p) noexcept nogil

cdef struct chan_ops_t:
    const char *name        # what Engine.peer_kind() says
    bint remote             # another process: says BYE, can be lost, beats
    bint polled_fd          # its data arrives on its fd: waiters poll the fd set every pass
    bint chunked            # DATA of a large message goes in ring-sized chunks
    bint overtake           # replies (CTS, FIN, CREDIT, BEAT) go ahead of queued frames
                            # not yet started, so a reply never waits behind bulk DATA
    chan_post_fn post       # takes a whole send itself (self: straight to the own queues)
    chan_put_fn put         # write one frame now if it fits (NULL: always queue and flush)
    chan_flush_fn flush     # hand queued frames to the channel, as many as fit
    chan_poll_fn poll       # consume what arrived, without an fd event (NULL: fd-driven)
    chan_event_fn on_event  # its fd (EV_PEER) is ready
    chan_arm_fn arm         # about to sleep (1) / awake (0): ask the peer to wake us
    chan_pull_fn pull       # a matched RTS: fetch the data itself, or ask the sender to
                            # write it (req_t.copier); False: stream (CTS)
    chan_push_fn push       # a CTS asking us to write the data into the receiver: PUSH_*
    chan_disarm_fn disarm   # the peer is lost: make sure a push it was asked for never lands
    chan_beat_fn beat       # tell the peer we are alive (heartbeat)
    bint beat_lockfree      # beat touches only the channel's own shared words: called
                            # without the engine lock (beat_main)
    chan_heard_fn heard     # a count that moves while the peer is alive
    chan_mem_fn memory      # bytes it holds
    chan_mem_fn unsent      # bytes handed to the channel the peer has not taken yet (NULL: none)
    chan_release_fn release # free its resources (the peer is already lost)

cdef struct pblock_t:   # a free block of the unexpected-message pool (queues.pxi)
    pblock_t *next

cdef struct umsg_t:     # an unexpected message: eager payload, or an RTS
    hdr_t h
    char *data          # the payload, in the same block, after this struct
    uint64_t block      # bytes of the block (pool_put)
    int src
    bint partial        # TCP payload still streaming in
    req_t *waiter       # receive that matched it while partial
    umsg_t *next        # every peer's, in arrival order (wildcard receives, aborts)
    umsg_t *prev
    umsg_t *pnext       # its sender's, in arrival order (a receive from that peer)
    umsg_t *pprev

cdef struct frame_t:    # something queued for a peer's channel
    hdr_t h
    char *payload
    uint64_t len        # payload bytes
    uint64_t off        # progress: TCP counts header+payload bytes; shm counts payload bytes
    req_t *req          # completed when the frame is fully handed over (sends)
    bint owns_payload
    bint chunked        # shm DATA: cut into ring-sized chunks
    bint reply          # a control reply queued ahead of bulk frames (chan_ops_t.overtake)
    req_t *owner        # held for credit: the send it carries (EAGER or RTS)
    frame_t *next

cdef struct peer_t:
    int rank
    chan_ops_t *ops     # NULL until a channel is adopted
    int lost            # 0 alive, E_PEER_LOST, E_CLOSED
    char reason[160]
    int fd              # TCP socket, or the Unix socket that tells a shm peer's death
    int in_epoll
    uint32_t ev_mask
    # --- shared memory
    char *seg
    size_t seg_len
    int side            # 0 for the lower rank of the pair
    volatile uint32_t *sleep_me
    volatile uint32_t *sleep_peer
    volatile uint32_t *txblk_me
    volatile uint32_t *txblk_peer
    volatile uint64_t *tx_head
    volatile uint64_t *tx_tail
    uint64_t tx_tail_mine   # what this side last stored at tx_tail (its only writer)
    uint64_t tx_head_seen   # the consumer's head as last read (it only grows: see shm_put)
    volatile uint64_t *rx_head
    volatile uint64_t *rx_tail
    char *tx_data
    char *rx_data
    uint64_t ring_bytes
    int peer_efd
    int pid
    bint cma_ok
    bint cma_proven     # a process_vm_readv from this peer has succeeded (split copies need it)
    uint64_t splits_shared  # messages received as split copies whose sender wrote its part
    uint64_t splits_alone   # ... whose sender had not begun: this rank read them whole
    uint64_t pushes         # messages this rank wrote whole into the peer's buffer (SENDER)
    # --- TCP receive state
    char *rxbuf
    size_t rx_pos
    size_t rx_end
    int rx_stage        # 0: header, 1: payload
    hdr_t rx_hdr
    char *rx_dst        # where the payload goes (NULL: discard)
    uint64_t rx_left
    req_t *rx_req       # request completed by this payload
    combine_fn rx_hook  # combine the payload into rx_dst instead of copying (reduce-receive)
    uint32_t rx_isz     # its element size: pieces are combined in whole elements
    umsg_t *rx_umsg     # or unexpected message filled by it
    bint in_rx          # inside tcp_rx (a reply's failed write must not read again)
    bint tx_broken      # a write failed (the peer is gone): read what it sent first, then lose it
    char abort_text[256]
    bint bye_seen       # read a BYE here: read no more from this stream (others may still
                        # bring DATA sent before it: closed once every stream said BYE)
    # --- extra TCP streams (COMMRT_TCP_STREAMS, tcp.pxi): DATA pieces striped over them
    peer_t *lanes       # on a main channel: nlanes lane structs, each a TCP stream of its own
    int nlanes
    int next_lane       # the lane the next DATA piece goes on
    peer_t *main        # on a lane: its peer's main channel (NULL on a main channel)
    int lane_ix         # on a lane: its index in main.lanes
    int byes            # on a main channel: BYEs read on all its streams
    # --- queues
    frame_t *txq
    frame_t *txq_tail
    req_t *await_head   # sends waiting for CTS or FIN
    req_t *rxact_head   # receives waiting for DATA
    umsg_t *unexp_head  # on a main channel: its unexpected messages (queues.pxi)
    umsg_t *unexp_tail
    uint32_t tx_seq
    uint32_t rx_seq
    # --- flow control (engine.pxi): eager credit, in bytes
    int64_t tx_credit   # what we may still send the peer (each EAGER/RTS costs msg_cost())
    frame_t *held       # EAGER/RTS frames waiting for credit, in send order
    frame_t *held_tail
    uint64_t owed       # credit of the peer's messages we matched, not yet handed back
    int64_t rx_used     # credit the peer spent on us and has not had back (checked)
    bint credit_queued  # a CREDIT frame waits in txq
    # --- liveness (the beat thread, engine.pxi)
    volatile uint64_t *beat_me      # shm: my beat counter in the pair's control page
    volatile uint64_t *beat_peer    # shm: the peer's
    volatile uint64_t *push_me      # shm: push slots of writes into this rank (shm.pxi)
    volatile uint64_t *push_peer    # shm: push slots of writes into the peer
    uint32_t seq_at_beat            # tx_seq when we last beat (TCP: beat only if idle since)
    uint64_t rx_raw                 # TCP: bytes read from the socket (a long frame is news too)
    uint64_t heard_seen             # the peer's ops.heard() count when it last moved
    int64_t heard_at                # ... and when (ns)
    # --- stats
    uint64_t bytes_sent
    uint64_t msgs_sent
    uint64_t bytes_recv
    uint64_t msgs_recv
    uint64_t hdr_sent
    uint64_t hdr_recv

cdef inline peer_t *main_of(peer_t *p) noexcept nogil:
    """A peer's channel, from the channel itself or from one of its lanes (tcp.pxi)."""
    return p.main if p.main != NULL else p


cdef struct poison_t:    # an aborted context: the first abort heard wins
    uint32_t ctx
    bint used
    int code            # errors.FailureCode
    int culprit         # world rank blamed (-1: none)
    int origin          # world rank that started the abort
    char reason[256]
