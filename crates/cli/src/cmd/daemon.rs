//! `capsule daemon`: the profiles' backups, forget, prune and check on
//! their schedules, in the foreground, as a service manager expects. The
//! scheduler is the application layer's ([`capsule_app::daemon`]).

use anyhow::Result;
use capsule_app::Settings;
use clap::Args;

use crate::exit;
use crate::output::Output;

/// Arguments of `daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {}

/// `capsule daemon`.
pub fn daemon(settings: &Settings, out: &Output, _a: DaemonArgs) -> Result<u8> {
    capsule_app::daemon::run(settings, &|w| out.warn(w))?;
    Ok(exit::OK)
}
