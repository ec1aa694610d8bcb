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
 * Only libc's bind() and connect() called through the dynamic linker are
 * seen: a module that makes the system call itself is not.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define ADDRESS_ENV "SMART_REPLAY_BIND_ADDRESS"
#define PRELOAD_WAS_ENV "SMART_REPLAY_BIND_LD_PRELOAD"

typedef int (*socket_call)(int, const struct sockaddr *, socklen_t);

static socket_call next_bind, next_connect;
/* The rewritten port (host order; 0: nothing in force) and its address. */
static int port;
static int target_is_v4;
static struct in_addr target4;
static struct in6_addr target6; /* ::ffff:a.b.c.d for an IPv4 target. */
static char target_text[INET6_ADDRSTRLEN];
static char error_text[256];
static long rewritten_binds, rewritten_connects;

static void resolve(void) {
  if (next_bind == NULL) next_bind = (socket_call)dlsym(RTLD_NEXT, "bind");
  if (next_connect == NULL) {
    next_connect = (socket_call)dlsym(RTLD_NEXT, "connect");
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

__attribute__((constructor)) static void load(void) {
  resolve();
  const char *spec = getenv(ADDRESS_ENV);
  if (spec == NULL) return; /* Loaded by hand: nothing to rewrite. */
  parse(spec);
  unsetenv(ADDRESS_ENV);
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
