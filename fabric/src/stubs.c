/*
 * Verbs the fabric does not model (UD address handles, multicast, object
 * import): they fail the way rdma-core does when a provider lacks them.
 */
#include "fabric.h"

#include <errno.h>

FAB_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	(void)pd;
	(void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	(void)ah;
	return EOPNOTSUPP;
}

FAB_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
				   struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	(void)context;
	(void)port_num;
	(void)wc;
	(void)grh;
	(void)ah_attr;
	return EOPNOTSUPP;
}

FAB_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
						uint8_t port_num)
{
	(void)pd;
	(void)wc;
	(void)grh;
	(void)port_num;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

FAB_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

FAB_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context;
	(void)pd_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

FAB_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd;
	(void)mr_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

FAB_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context;
	(void)dm_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}
