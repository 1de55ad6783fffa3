/* Fixed-width types shared by the BPF programs and the C++ agent.
 * Every map header includes this first; nothing here is specific to one map family. */
#ifndef SLUICE_MAPS_TYPES_H
#define SLUICE_MAPS_TYPES_H

#include <linux/types.h>

/* Layout checks: C++ pins every struct the datapath reads with static_assert. */
#if defined(__cplusplus)
#include <cstddef>
#define SLUICE_ASSERT_SIZE(type, size) static_assert(sizeof(type) == (size), #type " size")
#define SLUICE_ASSERT_OFFSET(type, field, off) \
	static_assert(offsetof(type, field) == (off), #type "." #field " offset")
#else
#define SLUICE_ASSERT_SIZE(type, size) _Static_assert(sizeof(type) == (size), #type " size")
#define SLUICE_ASSERT_OFFSET(type, field, off) \
	_Static_assert(__builtin_offsetof(type, field) == (off), #type "." #field " offset")
#endif

/* Prefix of every map and program name, and the default bpffs root they are pinned under. */
#define SLUICE_NAME_PREFIX "sluice_"
#define SLUICE_DEFAULT_BPFFS_ROOT "/sys/fs/bpf/sluice"

#endif
