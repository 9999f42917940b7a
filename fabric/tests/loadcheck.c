/*
 * Which libibverbs does the dynamic loader give a program? Opens it the way
 * NCCL does ("libibverbs.so" first, versioned dlvsym) and the way Rivet does
 * ("libibverbs.so.1", plain dlsym), loads the providers perftest links
 * (libmlx5, libefa) and librdmacm on top, and prints where each symbol lives.
 * Exit 0 only if every symbol resolves inside the directory given as argv[1].
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int from_dir(void *sym, const char *dir, const char *what)
{
	Dl_info info;
	char real[PATH_MAX];
	if (!sym || !dladdr(sym, &info) || !realpath(info.dli_fname, real)) {
		printf("  %-40s unresolved\n", what);
		return 0;
	}
	int ok = strncmp(real, dir, strlen(dir)) == 0;
	printf("  %-40s %s%s\n", what, real, ok ? "" : "  <-- not the fabric");
	return ok;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	char dir[PATH_MAX];
	if (!realpath(argv[1], dir))
		return 2;
	int ok = 1;
	void *nccl = dlopen("libibverbs.so", RTLD_NOW);
	void *rivet = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!nccl || !rivet) {
		printf("dlopen failed: %s\n", dlerror());
		return 1;
	}
	/* every symbol NCCL 2.28.9's ibvsymbols.cc loads at IBVERBS_1.1 (a missing one is fatal there) */
	static const char *const v11[] = {
		"ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
		"ibv_close_device",    "ibv_get_async_event",  "ibv_ack_async_event", "ibv_query_device",
		"ibv_query_port",      "ibv_query_gid",        "ibv_query_qp",        "ibv_alloc_pd",
		"ibv_dealloc_pd",      "ibv_reg_mr",           "ibv_dereg_mr",        "ibv_create_cq",
		"ibv_destroy_cq",      "ibv_create_qp",        "ibv_modify_qp",       "ibv_destroy_qp",
		"ibv_fork_init",       "ibv_event_type_str",   NULL};
	for (int i = 0; v11[i]; i++) {
		char what[96];
		snprintf(what, sizeof(what), "%s@IBVERBS_1.1", v11[i]);
		ok &= from_dir(dlvsym(nccl, v11[i], "IBVERBS_1.1"), dir, what);
	}
	ok &= from_dir(dlvsym(nccl, "ibv_reg_mr_iova2", "IBVERBS_1.8"), dir, "ibv_reg_mr_iova2@IBVERBS_1.8");
	ok &= from_dir(dlvsym(nccl, "ibv_query_ece", "IBVERBS_1.10"), dir, "ibv_query_ece@IBVERBS_1.10");
	ok &= from_dir(dlvsym(nccl, "ibv_set_ece", "IBVERBS_1.10"), dir, "ibv_set_ece@IBVERBS_1.10");
	ok &= from_dir(dlvsym(nccl, "ibv_reg_dmabuf_mr", "IBVERBS_1.12"), dir, "ibv_reg_dmabuf_mr@IBVERBS_1.12");
	ok &= from_dir(dlsym(rivet, "ibv_create_qp"), dir, "ibv_create_qp (plain dlsym)");
	ok &= from_dir(dlsym(rivet, "ibv_is_fork_initialized"), dir, "ibv_is_fork_initialized (plain dlsym)");
	static const char *const others[] = {"libmlx5.so.1", "libefa.so.1", "librdmacm.so.1", NULL};
	for (int i = 0; others[i]; i++) {
		void *h = dlopen(others[i], RTLD_NOW | RTLD_LOCAL);
		printf("  %-40s %s\n", others[i], h ? "loads" : dlerror());
		ok &= h != NULL;
	}
	return ok ? 0 : 1;
}
