/* Makes one listening TCP port of a process bind one address: an LD_PRELOAD
 * library for `smart-replay-serve` (smart_replay/ops/bind_address.py).
 *
 * Reverb 0.14's server always listens on [::]:PORT, every interface. Started
 * with LD_PRELOAD naming this library and SMART_REPLAY_BIND_ADDRESS=PORT,ADDR
 * in its environment, a process's bind() of a TCP socket to the unspecified
 * address (:: or 0.0.0.0) on PORT binds ADDR instead (an IPv4 ADDR as
 * ::ffff:a.b.c.d on an IPv6 socket); every other bind() passes through
 * unchanged. Its connect() of a TCP socket to a loopback address on PORT goes
 * to ADDR, so that the process still reaches its own port at localhost when
 * ADDR is another interface's address (or ::1 when ADDR is 127.0.0.1). An
 * IPv4 socket cannot take an IPv6 ADDR: its bind passes through unchanged
 * (gRPC listens on an IPv6 socket wherever IPv6 exists; an IPv4 one there is
 * a probe such as portpicker's), so the program must check where the port
 * listens once it does (bind_address.check_listening).
 *
 * At load (before the program's main) the library reads the variable, then
 * removes it from the environment and restores LD_PRELOAD to
 * SMART_REPLAY_BIND_LD_PRELOAD (the value before; unset if absent), so child
 * processes start without it. The smart_replay_bind_address_* functions tell
 * the program what is in force; a malformed variable leaves nothing in force
 * and says why (smart_replay_bind_address_error).
 *
 * A connection accepted on PORT from a socket of this machine owned by
 * another user is closed at once, before the program sees it (accept() and
 * accept4() take the next one): the peer's socket, found by its address pair
 * through the kernel's sock_diag netlink interface (what `ss` reads), must be
 * owned by this process's effective user. A peer not found there is another
 * machine's (when ADDR is an interface other machines reach) and is
 * accepted; one with a loopback address is refused.
 *
 * With SMART_REPLAY_CONNECTION_CAP=CAP_PORT,N in its environment too, a
 * connection accepted on CAP_PORT (e.g. a control service's) is closed at once
 * when its peer already holds N open connections to CAP_PORT. A peer is a user
 * of this machine (its socket's owner, as above: other users of the machine
 * share no cap with the program's own clients) or, for another machine's
 * socket, its address. Open connections are the accepted ones whose file
 * descriptor still refers to the same socket (its inode), checked at each
 * accept, so no close() needs to be seen.
 *
 * Only libc's bind(), connect(), accept() and accept4() called through the
 * dynamic linker are seen: a module that makes the system call itself is
 * not.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#define ADDRESS_ENV "SMART_REPLAY_BIND_ADDRESS"
#define PRELOAD_WAS_ENV "SMART_REPLAY_BIND_LD_PRELOAD"
#define CAP_ENV "SMART_REPLAY_CONNECTION_CAP"
/* Connections to the capped port tracked at once; more are refused. */
#define MAX_TRACKED 4096

typedef int (*socket_call)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_call)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_call)(int, struct sockaddr *, socklen_t *, int);

static socket_call next_bind, next_connect;
static accept_call next_accept;
static accept4_call next_accept4;
/* The rewritten port (host order; 0: nothing in force) and its address. */
static int port;
static int target_is_v4;
static struct in_addr target4;
static struct in6_addr target6; /* ::ffff:a.b.c.d for an IPv4 target. */
static char target_text[INET6_ADDRSTRLEN];
static char error_text[256];
static long rewritten_binds, rewritten_connects, refused_peers;
/* The capped port (host order; 0: none) and connections per peer. */
static int capped_port;
static long per_peer_cap;
static long refused_over_cap;

static void resolve(void) {
  if (next_bind == NULL) next_bind = (socket_call)dlsym(RTLD_NEXT, "bind");
  if (next_connect == NULL) {
    next_connect = (socket_call)dlsym(RTLD_NEXT, "connect");
  }
  if (next_accept == NULL) {
    next_accept = (accept_call)dlsym(RTLD_NEXT, "accept");
  }
  if (next_accept4 == NULL) {
    next_accept4 = (accept4_call)dlsym(RTLD_NEXT, "accept4");
  }
}

/* Parses "PORT,ADDRESS"; returns 0, or -1 with error_text set. */
static int parse(const char *spec) {
  char copy[128];
  if (strlen(spec) >= sizeof copy) {
    snprintf(error_text, sizeof error_text, "%s is too long", ADDRESS_ENV);
    return -1;
  }
  strcpy(copy, spec);
  char *comma = strchr(copy, ',');
  char *end = NULL;
  long number = comma ? strtol(copy, &end, 10) : 0;
  if (comma == NULL || end != comma || number < 1 || number > 65535) {
    snprintf(error_text, sizeof error_text,
             "%s=%.100s is not PORT,ADDRESS with PORT in 1..65535",
             ADDRESS_ENV, spec);
    return -1;
  }
  const char *address = comma + 1;
  if (inet_pton(AF_INET, address, &target4) == 1) {
    target_is_v4 = 1;
    memset(&target6, 0, sizeof target6);
    target6.s6_addr[10] = target6.s6_addr[11] = 0xff;
    memcpy(&target6.s6_addr[12], &target4, sizeof target4);
    inet_ntop(AF_INET, &target4, target_text, sizeof target_text);
  } else if (inet_pton(AF_INET6, address, &target6) == 1) {
    target_is_v4 = 0;
    inet_ntop(AF_INET6, &target6, target_text, sizeof target_text);
  } else {
    snprintf(error_text, sizeof error_text,
             "%s: %.100s is not an IPv4 or IPv6 address", ADDRESS_ENV,
             address);
    return -1;
  }
  port = (int)number;
  return 0;
}

/* Parses "PORT,N"; returns 0, or -1 with error_text set. */
static int parse_cap(const char *spec) {
  char *end = NULL;
  long number = strtol(spec, &end, 10);
  long cap = 0;
  if (end != NULL && *end == ',') cap = strtol(end + 1, &end, 10);
  if (end == NULL || *end != '\0' || number < 1 || number > 65535 ||
      cap < 1 || cap > MAX_TRACKED) {
    snprintf(error_text, sizeof error_text,
             "%s=%.100s is not PORT,N with PORT in 1..65535 and N in 1..%d",
             CAP_ENV, spec, MAX_TRACKED);
    return -1;
  }
  capped_port = (int)number;
  per_peer_cap = cap;
  return 0;
}

__attribute__((constructor)) static void load(void) {
  resolve();
  const char *spec = getenv(ADDRESS_ENV);
  if (spec == NULL) return; /* Loaded by hand: nothing to rewrite. */
  if (parse(spec) == 0 && getenv(CAP_ENV) != NULL &&
      parse_cap(getenv(CAP_ENV)) != 0) {
    port = 0; /* A bad cap leaves nothing in force, like a bad address. */
  }
  unsetenv(ADDRESS_ENV);
  unsetenv(CAP_ENV);
  const char *before = getenv(PRELOAD_WAS_ENV);
  if (before != NULL) {
    setenv("LD_PRELOAD", before, 1);
    unsetenv(PRELOAD_WAS_ENV);
  } else {
    unsetenv("LD_PRELOAD");
  }
}

int smart_replay_bind_address_port(void) { return port; }

const char *smart_replay_bind_address_host(void) {
  return port ? target_text : NULL;
}

const char *smart_replay_bind_address_error(void) {
  return error_text[0] ? error_text : NULL;
}

long smart_replay_bind_address_rewrites(void) {
  return __atomic_load_n(&rewritten_binds, __ATOMIC_RELAXED);
}

long smart_replay_bind_address_redirects(void) {
  return __atomic_load_n(&rewritten_connects, __ATOMIC_RELAXED);
}

long smart_replay_bind_address_refused(void) {
  return __atomic_load_n(&refused_peers, __ATOMIC_RELAXED);
}

int smart_replay_bind_address_capped_port(void) {
  return port ? capped_port : 0;
}

long smart_replay_bind_address_per_peer_cap(void) {
  return port ? per_peer_cap : 0;
}

long smart_replay_bind_address_refused_over_cap(void) {
  return __atomic_load_n(&refused_over_cap, __ATOMIC_RELAXED);
}

static int is_stream(int fd) {
  int type = 0;
  socklen_t size = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) == 0 &&
         type == SOCK_STREAM;
}

/* The port of an AF_INET or AF_INET6 address (host order), else -1. */
static int port_of(const struct sockaddr *address, socklen_t size) {
  if (address->sa_family == AF_INET6 &&
      size >= (socklen_t)sizeof(struct sockaddr_in6)) {
    return ntohs(((const struct sockaddr_in6 *)address)->sin6_port);
  }
  if (address->sa_family == AF_INET &&
      size >= (socklen_t)sizeof(struct sockaddr_in)) {
    return ntohs(((const struct sockaddr_in *)address)->sin_port);
  }
  return -1;
}

static int is_unspecified(const struct sockaddr *address) {
  if (address->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(
        &((const struct sockaddr_in6 *)address)->sin6_addr);
  }
  return ((const struct sockaddr_in *)address)->sin_addr.s_addr ==
         htonl(INADDR_ANY);
}

static int is_loopback(const struct sockaddr *address) {
  if (address->sa_family == AF_INET6) {
    const struct in6_addr *a =
        &((const struct sockaddr_in6 *)address)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return (ntohl(((const struct sockaddr_in *)address)->sin_addr.s_addr) >>
          24) == 127;
}

static int is_target(const struct sockaddr *address) {
  if (address->sa_family == AF_INET6) {
    return memcmp(&((const struct sockaddr_in6 *)address)->sin6_addr,
                  &target6, sizeof target6) == 0;
  }
  return target_is_v4 &&
         ((const struct sockaddr_in *)address)->sin_addr.s_addr ==
             target4.s_addr;
}

/* Writes `address` with the target's address into `out`; returns its size,
   or 0 if the socket's family cannot hold the target (IPv6 on AF_INET). */
static socklen_t retarget(const struct sockaddr *address,
                          struct sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  if (address->sa_family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
    *a = *(const struct sockaddr_in6 *)address;
    a->sin6_addr = target6;
    a->sin6_scope_id = 0;
    return sizeof *a;
  }
  if (!target_is_v4) return 0;
  struct sockaddr_in *a = (struct sockaddr_in *)out;
  *a = *(const struct sockaddr_in *)address;
  a->sin_addr = target4;
  return sizeof *a;
}

int bind(int fd, const struct sockaddr *address, socklen_t size) {
  resolve();
  if (port == 0 || address == NULL || port_of(address, size) != port ||
      !is_unspecified(address) || !is_stream(fd)) {
    return next_bind(fd, address, size);
  }
  struct sockaddr_storage rewritten;
  socklen_t rewritten_size = retarget(address, &rewritten);
  if (rewritten_size == 0) return next_bind(fd, address, size);
  __atomic_add_fetch(&rewritten_binds, 1, __ATOMIC_RELAXED);
  return next_bind(fd, (const struct sockaddr *)&rewritten, rewritten_size);
}

int connect(int fd, const struct sockaddr *address, socklen_t size) {
  resolve();
  if (port == 0 || address == NULL || port_of(address, size) != port ||
      !is_loopback(address) || is_target(address) || !is_stream(fd)) {
    return next_connect(fd, address, size);
  }
  struct sockaddr_storage rewritten;
  socklen_t rewritten_size = retarget(address, &rewritten);
  if (rewritten_size == 0) return next_connect(fd, address, size);
  __atomic_add_fetch(&rewritten_connects, 1, __ATOMIC_RELAXED);
  return next_connect(fd, (const struct sockaddr *)&rewritten,
                      rewritten_size);
}

/* An address as sock_diag looks it up: its family (AF_INET for an IPv4
   address mapped into IPv6, where the kernel keeps such connections), port
   (host order) and 4 or 16 bytes. */
struct endpoint {
  int family;
  int port;
  unsigned char bytes[16];
};

static int endpoint_of(const struct sockaddr_storage *address,
                       struct endpoint *out) {
  memset(out, 0, sizeof *out);
  if (address->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)address;
    out->family = AF_INET;
    out->port = ntohs(a->sin_port);
    memcpy(out->bytes, &a->sin_addr, 4);
    return 0;
  }
  if (address->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)address;
    out->port = ntohs(a->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      out->family = AF_INET;
      memcpy(out->bytes, &a->sin6_addr.s6_addr[12], 4);
    } else {
      out->family = AF_INET6;
      memcpy(out->bytes, &a->sin6_addr, 16);
    }
    return 0;
  }
  return -1;
}

static int endpoint_is_loopback(const struct endpoint *e) {
  if (e->family == AF_INET) return e->bytes[0] == 127;
  return IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)e->bytes);
}

/* The user owning this machine's TCP socket connected from `local` to
   `remote`: >= 0; -1 if there is none; -2 if the kernel could not be
   asked. */
static long socket_owner(const struct endpoint *local,
                         const struct endpoint *remote) {
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return -2;
  struct timeval wait = {1, 0}; /* The kernel answers at once. */
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  struct {
    struct nlmsghdr header;
    struct inet_diag_req_v2 request;
  } ask;
  memset(&ask, 0, sizeof ask);
  ask.header.nlmsg_len = sizeof ask;
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;
  ask.request.sdiag_family = (unsigned char)local->family;
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0U;
  ask.request.id.idiag_sport = htons((unsigned short)local->port);
  ask.request.id.idiag_dport = htons((unsigned short)remote->port);
  memcpy(ask.request.id.idiag_src, local->bytes, 16);
  memcpy(ask.request.id.idiag_dst, remote->bytes, 16);
  ask.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  struct sockaddr_nl kernel;
  memset(&kernel, 0, sizeof kernel);
  kernel.nl_family = AF_NETLINK;
  long owner = -2;
  if (sendto(nl, &ask, sizeof ask, 0, (struct sockaddr *)&kernel,
             sizeof kernel) == (ssize_t)sizeof ask) {
    long answer[1024]; /* Aligned for nlmsghdr. */
    ssize_t got = recv(nl, answer, sizeof answer, 0);
    const struct nlmsghdr *h = (const struct nlmsghdr *)answer;
    if (got >= (ssize_t)sizeof *h && NLMSG_OK(h, (size_t)got)) {
      if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = (const struct nlmsgerr *)NLMSG_DATA(h);
        owner = (h->nlmsg_len >= NLMSG_LENGTH(sizeof *e) &&
                 e->error == -ENOENT) ? -1 : -2;
      } else if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
                 h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
        owner = ((const struct inet_diag_msg *)NLMSG_DATA(h))->idiag_uid;
      }
    }
  }
  close(nl);
  return owner;
}

/* The connection `fd`, just accepted: its two ends, if it is an IP
   connection to `wanted` (host order). */
static int ends_of(int fd, int wanted, struct endpoint *self,
                   struct endpoint *peer, int *peer_known) {
  struct sockaddr_storage mine, theirs;
  socklen_t mine_size = sizeof mine, theirs_size = sizeof theirs;
  if (getsockname(fd, (struct sockaddr *)&mine, &mine_size) != 0 ||
      endpoint_of(&mine, self) != 0 || self->port != wanted) {
    return 0;
  }
  *peer_known = getpeername(fd, (struct sockaddr *)&theirs,
                            &theirs_size) == 0 &&
                endpoint_of(&theirs, peer) == 0;
  return 1;
}

/* Whether the connection `fd`, just accepted on PORT, comes from another
   user's socket on this machine (or from a loopback peer whose owner cannot
   be found). */
static int refuses_user(int fd) {
  struct endpoint self, peer;
  int peer_known = 0;
  if (port == 0 || !ends_of(fd, port, &self, &peer, &peer_known)) {
    return 0; /* Another port's, or not TCP: not ours to judge. */
  }
  if (!peer_known) return 1; /* Gone already, or not an IP peer. */
  /* The peer's socket: its local end is our remote one. */
  long owner = socket_owner(&peer, &self);
  if (owner == (long)geteuid()) return 0;
  if (owner == -1 && !endpoint_is_loopback(&peer)) return 0;
  return 1;
}

/* A connection to the capped port and its peer: a user of this machine
   (uid >= 0) or another machine's address. */
struct tracked {
  int fd;
  ino_t inode;
  long uid;
  struct endpoint address;
};

static struct tracked tracked[MAX_TRACKED];
static int num_tracked;
static pthread_mutex_t tracked_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_peer(const struct tracked *a, const struct tracked *b) {
  if (a->uid >= 0 || b->uid >= 0) return a->uid == b->uid;
  return a->address.family == b->address.family &&
         memcmp(a->address.bytes, b->address.bytes, 16) == 0;
}

/* Whether the connection `fd`, just accepted on the capped port, is one too
   many for its peer; if not, it is tracked. */
static int over_cap(int fd) {
  struct endpoint self;
  struct tracked entry;
  int peer_known = 0;
  struct stat status;
  if (capped_port == 0 || port == 0 ||
      !ends_of(fd, capped_port, &self, &entry.address, &peer_known)) {
    return 0;
  }
  if (!peer_known || fstat(fd, &status) != 0) return 1;
  entry.fd = fd;
  entry.inode = status.st_ino;
  long owner = socket_owner(&entry.address, &self);
  entry.uid = owner >= 0 ? owner : -1;
  if (owner == -1 && endpoint_is_loopback(&entry.address)) return 1;
  int refused = 0;
  long same = 0;
  pthread_mutex_lock(&tracked_lock);
  for (int i = 0; i < num_tracked;) {
    struct stat now;
    if (fstat(tracked[i].fd, &now) != 0 || now.st_ino != tracked[i].inode ||
        tracked[i].fd == fd) { /* Closed (or its number reused): gone. */
      tracked[i] = tracked[--num_tracked];
      continue;
    }
    same += same_peer(&tracked[i], &entry);
    ++i;
  }
  if (same >= per_peer_cap || num_tracked >= MAX_TRACKED) {
    refused = 1;
  } else {
    tracked[num_tracked++] = entry;
  }
  pthread_mutex_unlock(&tracked_lock);
  return refused;
}

static int screened(int fd) {
  if (fd < 0) return 0;
  if (refuses_user(fd)) {
    __atomic_add_fetch(&refused_peers, 1, __ATOMIC_RELAXED);
    close(fd);
    return 1;
  }
  if (over_cap(fd)) {
    __atomic_add_fetch(&refused_over_cap, 1, __ATOMIC_RELAXED);
    close(fd);
    return 1;
  }
  return 0;
}

int accept(int fd, struct sockaddr *address, socklen_t *size) {
  resolve();
  for (;;) {
    socklen_t given = size ? *size : 0;
    int client = next_accept(fd, address, size);
    if (!screened(client)) return client;
    if (size) *size = given;
  }
}

int accept4(int fd, struct sockaddr *address, socklen_t *size, int flags) {
  resolve();
  for (;;) {
    socklen_t given = size ? *size : 0;
    int client = next_accept4(fd, address, size, flags);
    if (!screened(client)) return client;
    if (size) *size = given;
  }
}
