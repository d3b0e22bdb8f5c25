/* A failed call's explanation, written into the caller's buffer: shared by the runtime and the
 * families' C (src/ops/). */
#ifndef BLOCKSPARSE_BSK_MESSAGE_H_
#define BLOCKSPARSE_BSK_MESSAGE_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Writes the message (if `message` is not NULL) and returns `status`. */
static inline __attribute__((format(printf, 4, 5))) int bsk_fail(char *message, size_t size, int status,
                                                                 const char *format, ...) {
  if (message && size) {
    va_list args;
    va_start(args, format);
    vsnprintf(message, size, format, args);
    va_end(args);
  }
  return status;
}

#endif /* BLOCKSPARSE_BSK_MESSAGE_H_ */
