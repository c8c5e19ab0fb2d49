# Wire format and the C structures of the engine.
#
# Every message, over a ring or a socket, starts with the same 56-byte
# header.  A shared-memory record is the header, then the payload, padded to
# 64 bytes; a TCP frame is the header then the payload.
#
#   opcode  meaning                         payload           fields used
#   EAGER   a whole small message           the message       nbytes, meta, tag
#   RTS     "I have a large message"        none              nbytes, cookie=send id, addr=send buffer
#   CTS     "matched: send the data"        none              cookie=send id, addr=recv id
#   DATA    (part of) a large message       nbytes bytes      cookie=recv id, addr=offset
#   FIN     "copied it myself" (CMA)        none              cookie=send id
#   ABORT   poison a context                reason text       ctx
#   BYE     orderly close                   none
#   PAD     skip to the ring's start        (ring only)

cdef enum:
    HDR_MAGIC = 0x54524D43          # "CMRT" little-endian
    WIRE_VERSION = 1
    HDR_SPACE = 64                  # header slot in a ring record (56 bytes used)
    REC_ALIGN = 64

cdef enum:
    OP_EAGER = 1
    OP_RTS = 2
    OP_CTS = 3
    OP_DATA = 4
    OP_FIN = 5
    OP_ABORT = 6
    OP_BYE = 7
    OP_PAD = 8
    OP_MAX = 8

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
    E_CLOSED = 4

cdef enum:
    P_SELF = 1
    P_SHM = 2
    P_TCP = 3

# epoll tags: (kind << 32) | rank
cdef enum:
    EV_TCP = 1
    EV_LIVE = 2
    EV_DOORBELL = 3
    EV_KICK = 4
    EV_IO = 5

# A reduce-receive's combine step: dst[i] = dst[i] OP src[i] for n elements
# (any C function of this shape; the transport does not know what it computes).
ctypedef void (*combine_fn)(void *dst, const void *src, int64_t n) noexcept nogil


cdef inline bint combinable_size(int itemsize) noexcept nogil:
    """An element size a reduce-receive can take: it divides 64, so no streamed
    chunk (a multiple of 64 bytes, see Engine.__cinit__) splits an element."""
    return 0 < itemsize <= 64 and 64 % itemsize == 0

cdef struct hdr_t:
    uint32_t magic
    uint8_t version
    uint8_t opcode
    uint16_t dtype
    int32_t src
    uint32_t ctx
    int32_t tag
    uint32_t seq
    uint64_t nbytes
    uint64_t meta
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
    uint16_t dtype
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
    bint persistent     # owned by an ExchangeChain: not put on the completion list
    # reduce-receive (recv only): the payload is combined into buf by hook, in
    # pieces of whole elements, instead of copied -- and only when it is the
    # message expected (meta == want_meta, nbytes == cap); any other leaves buf
    # untouched and completes with its own meta and size in the status
    combine_fn hook
    uint32_t itemsize
    uint64_t want_meta

cdef struct umsg_t:     # an unexpected message: eager payload, or an RTS
    hdr_t h
    char *data
    int src
    bint partial        # TCP payload still streaming in
    req_t *waiter       # receive that matched it while partial
    umsg_t *next
    umsg_t *prev

cdef struct frame_t:    # something queued for a peer's channel
    hdr_t h
    char *payload
    uint64_t len        # payload bytes
    uint64_t off        # progress: TCP counts header+payload bytes; shm counts payload bytes
    req_t *req          # completed when the frame is fully handed over (sends)
    bint owns_payload
    bint chunked        # shm DATA: cut into ring-sized chunks
    frame_t *next

cdef struct peer_t:
    int rank
    int kind
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
    volatile uint64_t *rx_head
    volatile uint64_t *rx_tail
    char *tx_data
    char *rx_data
    uint64_t ring_bytes
    int peer_efd
    int pid
    bint cma_ok
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
    char abort_text[256]
    # --- queues
    frame_t *txq
    frame_t *txq_tail
    req_t *await_head   # sends waiting for CTS or FIN
    req_t *rxact_head   # receives waiting for DATA
    uint32_t tx_seq
    uint32_t rx_seq
    # --- stats
    uint64_t bytes_sent
    uint64_t msgs_sent
    uint64_t bytes_recv
    uint64_t msgs_recv
    uint64_t hdr_sent
    uint64_t hdr_recv

cdef struct poison_t:
    uint32_t ctx
    bint used
    char reason[256]
