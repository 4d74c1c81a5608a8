//! MPI libraries as peers of a benchmark: the project's own C version of a benchmark's loop
//! (`benches/peers/*.c`), compiled with the library's `mpicc` and run with its `mpirun`,
//! one process per rank, so that weft and the library are measured with the same pattern in
//! the same sweep.
//!
//! | peer | Debian packages | compiler, launcher | settings |
//! |---|---|---|---|
//! | `openmpi` | `openmpi-bin libopenmpi-dev` | `mpicc.openmpi`, `mpirun.openmpi` | `pml=ob1`, `btl=self,vader` (shm) or `self,tcp` on `lo` (tcp), `--oversubscribe --bind-to none`, allowed to run as root |
//! | `mpich` | `mpich libmpich-dev` | `mpicc.mpich`, `mpirun.mpich` | its defaults (`FI_TCP_IFACE=lo` for tcp) |

use std::path::PathBuf;
use std::process::Command;

use weft::Provider;

/// Which MPI library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Open MPI.
    OpenMpi,
    /// MPICH.
    Mpich,
}

impl std::str::FromStr for Flavor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "openmpi" => Ok(Flavor::OpenMpi),
            "mpich" => Ok(Flavor::Mpich),
            o => Err(format!("unknown MPI peer {o:?} (openmpi, mpich)")),
        }
    }
}

impl Flavor {
    /// The library's name in a plot's legend.
    pub fn title(self) -> &'static str {
        match self {
            Flavor::OpenMpi => "Open MPI",
            Flavor::Mpich => "MPICH",
        }
    }

    /// The name used in tables.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::OpenMpi => "openmpi",
            Flavor::Mpich => "mpich",
        }
    }

    fn packages(self) -> &'static str {
        match self {
            Flavor::OpenMpi => "openmpi-bin libopenmpi-dev",
            Flavor::Mpich => "mpich libmpich-dev",
        }
    }

    /// The library's own `suffix` tool (`mpicc`, `mpirun`), by its Debian alternative name.
    fn tool(self, tool: &str) -> String {
        format!("{tool}.{}", self.name())
    }
}

/// A compiled peer program.
#[derive(Debug)]
pub struct Peer {
    flavor: Flavor,
    bin: PathBuf,
}

impl Peer {
    /// Compiles `source` (a C program) next to this binary as `<name>-<flavor>`.
    pub fn build(flavor: Flavor, name: &str, source: &str) -> Result<Peer, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let bin = exe.with_file_name(format!("{name}-{}", flavor.name()));
        let src = bin.with_extension("c");
        std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
        let cc = flavor.tool("mpicc");
        let out = Command::new(&cc)
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .map_err(|e| format!("{cc}: {e} (install {})", flavor.packages()))?;
        if !out.status.success() {
            return Err(format!("{cc} failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Peer { flavor, bin })
    }

    /// Which library.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Runs the program on `ranks` processes over `provider`'s kind of transport (at most
    /// `timeout_s` seconds) and returns the number after `key ` in its output.
    pub fn run(&self, ranks: usize, provider: Provider, timeout_s: u64, args: &[String], key: &str) -> Result<f64, String> {
        Ok(self.run_keys(ranks, provider, timeout_s, args, &[key])?[0])
    }

    /// [`run`](Self::run) for several values of one job: the number after each of `keys`.
    pub fn run_keys(&self, ranks: usize, provider: Provider, timeout_s: u64, args: &[String], keys: &[&str]) -> Result<Vec<f64>, String> {
        let out =
            self.command(ranks, provider, timeout_s).args(args).output().map_err(|e| format!("{}: {e}", self.flavor.tool("mpirun")))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "{} job ({provider}, {ranks} ranks) failed ({}):\n{stdout}{}",
                self.flavor.name(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        keys.iter()
            .map(|key| parse_value(&stdout, key).ok_or_else(|| format!("no {key} in the {} job's output:\n{stdout}", self.flavor.name())))
            .collect()
    }

    fn command(&self, ranks: usize, provider: Provider, timeout_s: u64) -> Command {
        let mut c = Command::new("timeout");
        c.arg(timeout_s.to_string()).arg(self.flavor.tool("mpirun")).stdin(std::process::Stdio::null());
        match self.flavor {
            Flavor::OpenMpi => {
                c.args(["--oversubscribe", "--bind-to", "none", "-np", &ranks.to_string()])
                    .env("OMPI_MCA_btl", if provider == Provider::Tcp { "self,tcp" } else { "self,vader" })
                    .env("OMPI_MCA_pml", "ob1")
                    .env("OMPI_MCA_btl_tcp_if_include", "lo")
                    .env("OMPI_MCA_oob_tcp_if_include", "lo")
                    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            }
            Flavor::Mpich => {
                c.args(["-np", &ranks.to_string()]).env("FI_TCP_IFACE", "lo");
            }
        }
        c.arg(&self.bin);
        c
    }
}

/// The number after `key ` on a line of `stdout`.
fn parse_value(stdout: &str, key: &str) -> Option<f64> {
    stdout.lines().find_map(|l| l.trim().strip_prefix(key).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse::<f64>().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_by_key() {
        assert_eq!(parse_value("x\nMSG_RATE 123\n", "MSG_RATE"), Some(123.0));
        assert_eq!(parse_value("MSG_RATES 5\n", "MSG_RATE"), None);
        assert_eq!(parse_value("ROUND_US 2.5", "ROUND_US"), Some(2.5));
        assert_eq!("mpich".parse::<Flavor>(), Ok(Flavor::Mpich));
        assert!("lam".parse::<Flavor>().is_err());
    }
}
