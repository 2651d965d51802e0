/* version: duoserve's version, shown by `duoserve --version`, GET /version and inside
 * system_fingerprint. The git hash and the CUDA build that --version adds are main.c's. */
#ifndef DUO_VERSION_H
#define DUO_VERSION_H

#define DUO_VERSION "0.1.0"

#endif
