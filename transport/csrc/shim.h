/*
 * weft libfabric shim: out-of-line wrappers over the `static inline` calls of the
 * libfabric 1.x headers (they dispatch through per-object ops tables, so there is no
 * symbol for Rust to link against). Every wrapper is a one-line forward; the Rust side
 * (`transport/src/ofi/sys.rs`) documents the contracts.
 */
#ifndef WEFT_OFI_SHIM_H
#define WEFT_OFI_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_eq.h>

/* FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) of the headers weft was built with. */
uint32_t weft_fi_header_version(void);

int weft_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
                   struct fid_domain **domain, void *context);
int weft_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
                     struct fid_ep **ep, void *context);
int weft_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                    struct fid_cq **cq, void *context);
int weft_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                    struct fid_av **av, void *context);
int weft_fi_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr,
                      struct fid_cntr **cntr, void *context);
int weft_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int weft_fi_enable(struct fid_ep *ep);
int weft_fi_close(struct fid *fid);
int weft_fi_control(struct fid *fid, int command, void *arg);
int weft_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int weft_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
                      fi_addr_t *fi_addr, uint64_t flags, void *context);
int weft_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);

ssize_t weft_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                     fi_addr_t dest_addr, void *context);
ssize_t weft_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                     fi_addr_t src_addr, void *context);
ssize_t weft_fi_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr);
ssize_t weft_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                      fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t weft_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                      fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context);
ssize_t weft_fi_tinject(struct fid_ep *ep, const void *buf, size_t len,
                        fi_addr_t dest_addr, uint64_t tag);

ssize_t weft_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t weft_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *weft_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                                char *buf, size_t len);
uint64_t weft_fi_cntr_read(struct fid_cntr *cntr);
uint64_t weft_fi_cntr_readerr(struct fid_cntr *cntr);

int weft_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                   uint64_t offset, uint64_t requested_key, uint64_t flags,
                   struct fid_mr **mr, void *context);
uint64_t weft_fi_mr_key(struct fid_mr *mr);
void *weft_fi_mr_desc(struct fid_mr *mr);

ssize_t weft_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                     fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context);
ssize_t weft_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                      fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context);
/* fi_write whose completion waits for the target to have applied the data
 * (FI_DELIVERY_COMPLETE), through fi_writemsg. */
ssize_t weft_fi_write_delivered(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context);
ssize_t weft_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                             void *result, void *result_desc, fi_addr_t dest_addr,
                             uint64_t addr, uint64_t key, enum fi_datatype datatype,
                             enum fi_op op, void *context);
ssize_t weft_fi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                               const void *compare, void *compare_desc, void *result,
                               void *result_desc, fi_addr_t dest_addr, uint64_t addr,
                               uint64_t key, enum fi_datatype datatype, enum fi_op op,
                               void *context);
int weft_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                              size_t *count);
int weft_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                                size_t *count);

#endif
