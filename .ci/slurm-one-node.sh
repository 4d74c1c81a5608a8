#!/bin/sh
# A one-node Slurm cluster on this machine, for the multi-process tests under
# `srun --mpi=pmix` (`runtime/launcher/tests/multiprocess.rs`, module `under_srun`, which
# skip themselves with a reason where `sinfo` finds no idle node). Debian's `slurm-wlm`
# (Slurm 22.05) carries the PMIx plugin (`srun --mpi=list`: pmix, pmix_v4). Installs it when
# missing, writes a slurm.conf for this host only when there is none, and starts munged,
# slurmctld and slurmd when they are not running; waits (bounded) until the node is up.
# Needs root (the daemons); elsewhere it says so and does nothing.
set -eu
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-one-node: not root: skipped"
    exit 0
fi
if ! dpkg-query -W -f='${Status}' slurm-wlm 2>/dev/null | grep -q "install ok installed"; then
    echo "slurm-one-node: installing slurm-wlm"
    apt-get install -y slurm-wlm >/dev/null || { apt-get update >/dev/null && apt-get install -y slurm-wlm >/dev/null; }
fi
host=$(hostname)
if [ ! -f /etc/slurm/slurm.conf ]; then
    mkdir -p /etc/slurm
    mem=$(awk '/MemTotal/ { print int($2 / 1024 * 0.8) }' /proc/meminfo)
    cat >/etc/slurm/slurm.conf <<EOF
ClusterName=weft
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
fi
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge 2>/dev/null || true
# munged answers (a credential can be made), or is started; the Slurm daemons need it.
if ! munge -n >/dev/null 2>&1; then
    su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
fi
# (`pgrep -x` without zombies: a daemon that died is started again.)
running() { pgrep -x -r R,S,D "$1" >/dev/null; }
running slurmctld || /usr/sbin/slurmctld
running slurmd || /usr/sbin/slurmd
i=0
until timeout 5 sinfo -h -o %t 2>/dev/null | grep -Eq 'idle|mix|alloc'; do
    i=$((i + 1))
    if [ "$i" -gt 30 ]; then
        echo "slurm-one-node: the node did not come up within 30 s: the srun tests will skip"
        exit 0
    fi
    sleep 1
done
echo "slurm-one-node: up ($(srun --mpi=list 2>&1 | tr -s '\n\t ' ' '))"
