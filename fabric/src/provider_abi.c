/*
 * rdma-core's private provider interface (IBVERBS_PRIVATE_34 and friends).
 * perftest links libmlx5 and libefa directly; those providers import these
 * names, and their constructors call verbs_register_driver_34. The fabric has
 * no providers: registration is ignored and every command fails with ENOSYS.
 * Deliberately without <infiniband/verbs.h>: the real prototypes live in
 * rdma-core's uninstalled driver.h, and no caller ever reaches these bodies
 * with a fabric device.
 */
#include <errno.h>

#define FAB_EXPORT __attribute__((visibility("default")))

#define FAB_ENOSYS(name)                                                                                   \
	int name(void);                                                                                    \
	FAB_EXPORT int name(void)                                                                          \
	{                                                                                                  \
		return ENOSYS;                                                                             \
	}

void verbs_register_driver_34(void *ops);
FAB_EXPORT void verbs_register_driver_34(void *ops)
{
	(void)ops;
}

void __verbs_log(void *ctx, const char *fmt, ...);
FAB_EXPORT void __verbs_log(void *ctx, const char *fmt, ...)
{
	(void)ctx;
	(void)fmt;
}

void *_verbs_init_and_alloc_context(void);
FAB_EXPORT void *_verbs_init_and_alloc_context(void)
{
	errno = ENOSYS;
	return 0;
}

void verbs_uninit_context(void *ctx);
FAB_EXPORT void verbs_uninit_context(void *ctx)
{
	(void)ctx;
}

void verbs_set_ops(void *ctx, const void *ops);
FAB_EXPORT void verbs_set_ops(void *ctx, const void *ops)
{
	(void)ctx;
	(void)ops;
}

void verbs_init_cq(void *cq, void *ctx, void *channel, void *cq_context);
FAB_EXPORT void verbs_init_cq(void *cq, void *ctx, void *channel, void *cq_context)
{
	(void)cq;
	(void)ctx;
	(void)channel;
	(void)cq_context;
}

int verbs_allow_disassociate_destroy;
FAB_EXPORT int verbs_allow_disassociate_destroy;

void ibv_copy_ah_attr_from_kern(void *dst, const void *src);
FAB_EXPORT void ibv_copy_ah_attr_from_kern(void *dst, const void *src)
{
	(void)dst;
	(void)src;
}
void ibv_copy_qp_attr_from_kern(void *dst, const void *src);
FAB_EXPORT void ibv_copy_qp_attr_from_kern(void *dst, const void *src)
{
	(void)dst;
	(void)src;
}
void ibv_copy_path_rec_from_kern(void *dst, const void *src);
FAB_EXPORT void ibv_copy_path_rec_from_kern(void *dst, const void *src)
{
	(void)dst;
	(void)src;
}
void ibv_copy_path_rec_to_kern(void *dst, const void *src);
FAB_EXPORT void ibv_copy_path_rec_to_kern(void *dst, const void *src)
{
	(void)dst;
	(void)src;
}

FAB_ENOSYS(ibv_resolve_eth_l2_from_gid)
FAB_ENOSYS(ibv_read_ibdev_sysfs_file)
FAB_ENOSYS(__ioctl_final_num_attrs)
FAB_ENOSYS(execute_ioctl)
FAB_ENOSYS(verbs_open_device)
FAB_ENOSYS(ibv_cmd_advise_mr)
FAB_ENOSYS(ibv_cmd_alloc_dm)
FAB_ENOSYS(ibv_cmd_alloc_mw)
FAB_ENOSYS(ibv_cmd_alloc_pd)
FAB_ENOSYS(ibv_cmd_attach_mcast)
FAB_ENOSYS(ibv_cmd_close_xrcd)
FAB_ENOSYS(ibv_cmd_create_ah)
FAB_ENOSYS(ibv_cmd_create_counters)
FAB_ENOSYS(ibv_cmd_create_cq)
FAB_ENOSYS(ibv_cmd_create_cq_ex)
FAB_ENOSYS(ibv_cmd_create_flow)
FAB_ENOSYS(ibv_cmd_create_flow_action_esp)
FAB_ENOSYS(ibv_cmd_create_qp)
FAB_ENOSYS(ibv_cmd_create_qp_ex)
FAB_ENOSYS(ibv_cmd_create_qp_ex2)
FAB_ENOSYS(ibv_cmd_create_rwq_ind_table)
FAB_ENOSYS(ibv_cmd_create_srq)
FAB_ENOSYS(ibv_cmd_create_srq_ex)
FAB_ENOSYS(ibv_cmd_create_wq)
FAB_ENOSYS(ibv_cmd_dealloc_mw)
FAB_ENOSYS(ibv_cmd_dealloc_pd)
FAB_ENOSYS(ibv_cmd_dereg_mr)
FAB_ENOSYS(ibv_cmd_destroy_ah)
FAB_ENOSYS(ibv_cmd_destroy_counters)
FAB_ENOSYS(ibv_cmd_destroy_cq)
FAB_ENOSYS(ibv_cmd_destroy_flow)
FAB_ENOSYS(ibv_cmd_destroy_flow_action)
FAB_ENOSYS(ibv_cmd_destroy_qp)
FAB_ENOSYS(ibv_cmd_destroy_rwq_ind_table)
FAB_ENOSYS(ibv_cmd_destroy_srq)
FAB_ENOSYS(ibv_cmd_destroy_wq)
FAB_ENOSYS(ibv_cmd_detach_mcast)
FAB_ENOSYS(ibv_cmd_free_dm)
FAB_ENOSYS(ibv_cmd_get_context)
FAB_ENOSYS(ibv_cmd_modify_cq)
FAB_ENOSYS(ibv_cmd_modify_flow_action_esp)
FAB_ENOSYS(ibv_cmd_modify_qp)
FAB_ENOSYS(ibv_cmd_modify_qp_ex)
FAB_ENOSYS(ibv_cmd_modify_srq)
FAB_ENOSYS(ibv_cmd_modify_wq)
FAB_ENOSYS(ibv_cmd_open_qp)
FAB_ENOSYS(ibv_cmd_open_xrcd)
FAB_ENOSYS(ibv_cmd_poll_cq)
FAB_ENOSYS(ibv_cmd_post_recv)
FAB_ENOSYS(ibv_cmd_post_send)
FAB_ENOSYS(ibv_cmd_post_srq_recv)
FAB_ENOSYS(ibv_cmd_query_context)
FAB_ENOSYS(ibv_cmd_query_device_any)
FAB_ENOSYS(ibv_cmd_query_mr)
FAB_ENOSYS(ibv_cmd_query_port)
FAB_ENOSYS(ibv_cmd_query_qp)
FAB_ENOSYS(ibv_cmd_query_srq)
FAB_ENOSYS(ibv_cmd_read_counters)
FAB_ENOSYS(ibv_cmd_reg_dm_mr)
FAB_ENOSYS(ibv_cmd_reg_dmabuf_mr)
FAB_ENOSYS(ibv_cmd_reg_mr)
FAB_ENOSYS(ibv_cmd_req_notify_cq)
FAB_ENOSYS(ibv_cmd_rereg_mr)
FAB_ENOSYS(ibv_cmd_resize_cq)
