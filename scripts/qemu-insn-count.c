/*
 * A qemu TCG plugin that counts the guest instructions a program executes and writes the total
 * to a file when it exits. scripts/arm-insns.sh compiles it at run time against the
 * qemu-plugin.h of the installed qemu (Debian's qemu-user ships no plugins and no header):
 *
 *   gcc -shared -fPIC -O2 -I DIR_OF_QEMU_PLUGIN_H -o libinsncount.so scripts/qemu-insn-count.c
 *   qemu-aarch64 -cpu neoverse-n1 -plugin ./libinsncount.so,out=/tmp/n PROGRAM ARGS...
 *
 * Counting is inline (an add per executed translation block, of that block's instruction
 * count), so it costs little beside the emulation itself. A block left early by an exception
 * counts whole; no inference loop does that. With plugin API 1 (qemu 7.x, 8.x) all vCPUs (the
 * guest's threads) add to one counter without atomics, so the total is exact only for a
 * single-threaded computation: run the engines with one thread. API 2 and later (qemu 9+)
 * give each vCPU its own counter.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static const char *out_path;

#if QEMU_PLUGIN_VERSION >= 2
static struct qemu_plugin_scoreboard *counts;
static qemu_plugin_u64 count_entry;
#else
static uint64_t count;
#endif

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
#if QEMU_PLUGIN_VERSION >= 2
    qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, count_entry,
                                                      qemu_plugin_tb_n_insns(tb));
#else
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count,
                                             qemu_plugin_tb_n_insns(tb));
#endif
}

static void report_count(qemu_plugin_id_t id, void *data)
{
    (void)id;
    (void)data;
#if QEMU_PLUGIN_VERSION >= 2
    uint64_t total = qemu_plugin_u64_sum(count_entry);
#else
    uint64_t total = count;
#endif
    FILE *f = out_path ? fopen(out_path, "w") : NULL;
    if (f) {
        fprintf(f, "%" PRIu64 "\n", total);
        fclose(f);
    } else {
        char line[64];
        snprintf(line, sizeof line, "insns: %" PRIu64 "\n", total);
        qemu_plugin_outs(line);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = strdup(argv[i] + 4);
        } else {
            fprintf(stderr, "qemu-insn-count: unknown argument %s (only out=FILE)\n", argv[i]);
            return -1;
        }
    }
#if QEMU_PLUGIN_VERSION >= 2
    counts = qemu_plugin_scoreboard_new(sizeof(uint64_t));
    count_entry = qemu_plugin_scoreboard_u64(counts);
#endif
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, report_count, NULL);
    return 0;
}
