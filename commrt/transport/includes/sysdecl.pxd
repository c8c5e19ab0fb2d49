# Foreign declarations of the C headers the transport core uses, and nothing
# else.  All are safe to call without the GIL.
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "commrt_atomic.h" nogil:
    uint64_t ld_acq_u64(volatile uint64_t *p)
    void st_rel_u64(volatile uint64_t *p, uint64_t v)
    uint32_t ld_acq_u32(volatile uint32_t *p)
    void st_rel_u32(volatile uint32_t *p, uint32_t v)
    int cas_u32(volatile uint32_t *p, uint32_t expect, uint32_t desired)
    int cas_u64(volatile uint64_t *p, uint64_t expect, uint64_t desired)
    void fence_seq_cst()
    void cpu_relax()
    int64_t now_ns()

cdef extern from "<errno.h>" nogil:
    int errno
    enum:
        EINTR
        EAGAIN
        EWOULDBLOCK
        EPERM
        ENOSYS
        EFAULT
        ESRCH
        EINVAL
        ENOMEM

cdef extern from "<sys/epoll.h>" nogil:
    enum:
        EPOLLIN
        EPOLLOUT
        EPOLLERR
        EPOLLHUP
        EPOLLRDHUP
        EPOLL_CTL_ADD
        EPOLL_CTL_MOD
        EPOLL_CTL_DEL
        EPOLL_CLOEXEC
    ctypedef union epoll_data_t:
        void *ptr
        int fd
        uint32_t u32
        uint64_t u64
    struct epoll_event:
        uint32_t events
        epoll_data_t data
    int epoll_create1(int flags)
    int epoll_ctl(int epfd, int op, int fd, epoll_event *event)
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)

cdef extern from "<sys/eventfd.h>" nogil:
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC
    int eventfd(unsigned int initval, int flags)

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t writev(int fd, const iovec *iov, int iovcnt)
    ssize_t process_vm_readv(int pid, const iovec *local_iov, unsigned long liovcnt,
                             const iovec *remote_iov, unsigned long riovcnt, unsigned long flags)
    ssize_t process_vm_writev(int pid, const iovec *local_iov, unsigned long liovcnt,
                              const iovec *remote_iov, unsigned long riovcnt, unsigned long flags)

cdef extern from "<sys/socket.h>" nogil:
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)

cdef extern from "<sys/mman.h>" nogil:
    enum:
        PROT_READ
        PROT_WRITE
        MAP_SHARED
        MAP_POPULATE
    void *MAP_FAILED
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)

cdef extern from "<unistd.h>" nogil:
    ssize_t read(int fd, void *buf, size_t n)
    ssize_t write(int fd, const void *buf, size_t n)
    int close(int fd)
    int usleep(unsigned int usec)

cdef extern from "<sys/ioctl.h>" nogil:
    int ioctl(int fd, unsigned long request, ...)

cdef extern from "<linux/sockios.h>" nogil:
    enum:
        SIOCOUTQ        # bytes in a TCP socket's send queue the peer has not acknowledged

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef struct pthread_condattr_t:
        pass
    ctypedef unsigned long pthread_t
    int pthread_mutex_init(pthread_mutex_t *m, void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_condattr_init(pthread_condattr_t *a)
    int pthread_condattr_setclock(pthread_condattr_t *a, int clock)
    int pthread_cond_init(pthread_cond_t *c, pthread_condattr_t *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_signal(pthread_cond_t *c)
    int pthread_cond_broadcast(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_create(pthread_t *t, void *attr, void *(*fn)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t t, void **ret)

cdef extern from "<time.h>" nogil:
    enum:
        CLOCK_MONOTONIC
        CLOCK_REALTIME
    struct timespec:
        long tv_sec
        long tv_nsec
    int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const timespec *abstime)
    int pthread_mutex_timedlock(pthread_mutex_t *m, const timespec *abstime)   # CLOCK_REALTIME
    int clock_gettime(int clk, timespec *ts)

cdef extern from "<malloc.h>" nogil:
    int malloc_trim(size_t pad)

cdef extern from "<stdio.h>" nogil:
    int snprintf(char *s, size_t n, const char *fmt, ...)
