/* libFuzzer target: the Shardcast manifest parser on hostile bytes. Whatever
 * it accepts must be self-consistent: shard ranges tile the file and wire
 * offsets stay inside the wire stream. */
#include <stdint.h>
#include <stdlib.h>
#include "vkswarm/vks_shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vks_manifest m;
    if (vks_manifest_parse(data, size, "fuzz", &m) != VKS_OK) return 0;
    uint64_t covered = 0;
    for (uint32_t i = 0; i < m.n_shards; i++) {
        uint64_t off;
        uint32_t len;
        vks_shard_range(&m, i, &off, &len);
        if (off != covered || len == 0 || len > m.shard_size) abort();
        covered += len;
        if (m.shards[i].wire_offset + m.shards[i].wire_size > m.wire_size) abort();
    }
    if (covered != m.file_size || m.wire_size > m.file_size) abort();
    vks_manifest_free(&m);
    return 0;
}
