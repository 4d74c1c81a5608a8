/* See shim.h. One forward per libfabric `static inline` call that weft uses. */
#include "shim.h"

uint32_t weft_fi_header_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }

int weft_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
                   struct fid_domain **domain, void *context)
{ return fi_domain(fabric, info, domain, context); }

int weft_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
                     struct fid_ep **ep, void *context)
{ return fi_endpoint(domain, info, ep, context); }

int weft_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                    struct fid_cq **cq, void *context)
{ return fi_cq_open(domain, attr, cq, context); }

int weft_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                    struct fid_av **av, void *context)
{ return fi_av_open(domain, attr, av, context); }

int weft_fi_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr,
                      struct fid_cntr **cntr, void *context)
{ return fi_cntr_open(domain, attr, cntr, context); }

int weft_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags)
{ return fi_ep_bind(ep, bfid, flags); }

int weft_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }

int weft_fi_close(struct fid *fid) { return fi_close(fid); }

int weft_fi_control(struct fid *fid, int command, void *arg)
{ return fi_control(fid, command, arg); }

int weft_fi_getname(struct fid *fid, void *addr, size_t *addrlen)
{ return fi_getname(fid, addr, addrlen); }

int weft_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
                      fi_addr_t *fi_addr, uint64_t flags, void *context)
{ return fi_av_insert(av, addr, count, fi_addr, flags, context); }

int weft_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{ return fi_trywait(fabric, fids, count); }

ssize_t weft_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                     fi_addr_t dest_addr, void *context)
{ return fi_send(ep, buf, len, desc, dest_addr, context); }

ssize_t weft_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                     fi_addr_t src_addr, void *context)
{ return fi_recv(ep, buf, len, desc, src_addr, context); }

ssize_t weft_fi_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr)
{ return fi_inject(ep, buf, len, dest_addr); }

ssize_t weft_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                      fi_addr_t dest_addr, uint64_t tag, void *context)
{ return fi_tsend(ep, buf, len, desc, dest_addr, tag, context); }

ssize_t weft_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                      fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context)
{ return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context); }

ssize_t weft_fi_tinject(struct fid_ep *ep, const void *buf, size_t len,
                        fi_addr_t dest_addr, uint64_t tag)
{ return fi_tinject(ep, buf, len, dest_addr, tag); }

ssize_t weft_fi_cq_read(struct fid_cq *cq, void *buf, size_t count)
{ return fi_cq_read(cq, buf, count); }

ssize_t weft_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{ return fi_cq_readerr(cq, buf, flags); }

const char *weft_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                                char *buf, size_t len)
{ return fi_cq_strerror(cq, prov_errno, err_data, buf, len); }

uint64_t weft_fi_cntr_read(struct fid_cntr *cntr) { return fi_cntr_read(cntr); }

uint64_t weft_fi_cntr_readerr(struct fid_cntr *cntr) { return fi_cntr_readerr(cntr); }

int weft_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                   uint64_t offset, uint64_t requested_key, uint64_t flags,
                   struct fid_mr **mr, void *context)
{ return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context); }

uint64_t weft_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }

void *weft_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

ssize_t weft_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                     fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context)
{ return fi_read(ep, buf, len, desc, src_addr, addr, key, context); }

ssize_t weft_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                      fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context)
{ return fi_write(ep, buf, len, desc, dest_addr, addr, key, context); }

ssize_t weft_fi_write_delivered(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context)
{
    struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
    struct fi_rma_iov rma = { .addr = addr, .len = len, .key = key };
    struct fi_msg_rma msg = {
        .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = dest_addr,
        .rma_iov = &rma, .rma_iov_count = 1, .context = context, .data = 0,
    };
    return fi_writemsg(ep, &msg, FI_DELIVERY_COMPLETE);
}

ssize_t weft_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                             void *result, void *result_desc, fi_addr_t dest_addr,
                             uint64_t addr, uint64_t key, enum fi_datatype datatype,
                             enum fi_op op, void *context)
{
    return fi_fetch_atomic(ep, buf, count, desc, result, result_desc, dest_addr, addr, key,
                           datatype, op, context);
}

ssize_t weft_fi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                               const void *compare, void *compare_desc, void *result,
                               void *result_desc, fi_addr_t dest_addr, uint64_t addr,
                               uint64_t key, enum fi_datatype datatype, enum fi_op op,
                               void *context)
{
    return fi_compare_atomic(ep, buf, count, desc, compare, compare_desc, result, result_desc,
                             dest_addr, addr, key, datatype, op, context);
}

int weft_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                              size_t *count)
{ return fi_fetch_atomicvalid(ep, datatype, op, count); }

int weft_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                                size_t *count)
{ return fi_compare_atomicvalid(ep, datatype, op, count); }
