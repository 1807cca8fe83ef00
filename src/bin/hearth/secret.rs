//! `hearth secret put|list|delete`: a Worker's secrets, through a node's
//! admin API. A value is read from stdin (never a flag, so it stays out of
//! shell history and `ps`), and no command prints one.

use std::io::{IsTerminal, Read};

use anyhow::{Context, bail};
use hearth_admin_client::AdminError;
use zeroize::Zeroizing;

/// `hearth secret`'s flags.
#[derive(clap::Args)]
pub(crate) struct SecretArgs {
    #[command(flatten)]
    admin: crate::versions::AdminArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Set secret NAME of SCRIPT to the value read from stdin (one trailing
    /// newline removed); every node serves with it from the next request.
    Put {
        /// The Worker (deployed already).
        script: String,
        /// The secret's name (letters, digits and '_').
        name: String,
    },
    /// List the names of SCRIPT's secrets (values are never shown).
    List {
        /// The Worker.
        script: String,
    },
    /// Delete secret NAME of SCRIPT.
    Delete {
        /// The Worker.
        script: String,
        /// The secret's name.
        name: String,
    },
}

/// Runs one `hearth secret` command.
pub(crate) async fn run(args: SecretArgs) -> anyhow::Result<()> {
    let admin = args.admin.client()?;
    let refused = |e: AdminError| match e {
        AdminError::Refused { status, body, .. } => anyhow::anyhow!("refused ({status}): {body}"),
        e => e.into(),
    };
    match args.action {
        Action::Put { script, name } => {
            let value = read_value(&name)?;
            let done = admin
                .put_secret(&script, &name, &value)
                .await
                .map_err(refused)?;
            println!("secret {name} of {script} set");
            print_announced(done.announced.members, done.announced.acknowledged);
        }
        Action::List { script } => {
            let list = admin.secrets(&script).await.map_err(refused)?;
            if list.secrets.is_empty() {
                println!("{script} has no secrets");
            }
            for name in list.secrets {
                println!("{name}");
            }
        }
        Action::Delete { script, name } => {
            let done = admin.delete_secret(&script, &name).await.map_err(refused)?;
            if done.deleted == Some(true) {
                println!("secret {name} of {script} deleted");
                print_announced(done.announced.members, done.announced.acknowledged);
            } else {
                bail!("{script} has no secret named {name}");
            }
        }
    }
    Ok(())
}

/// The value from stdin: all of it, less one trailing newline; on a
/// terminal, one line after a prompt on stderr.
fn read_value(name: &str) -> anyhow::Result<Zeroizing<String>> {
    let mut value = Zeroizing::new(String::new());
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("value of {name} (one line, then Enter): ");
        stdin.read_line(&mut value).context("reading the value")?;
    } else {
        stdin
            .lock()
            .read_to_string(&mut value)
            .context("reading the value from stdin")?;
    }
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    Ok(value)
}

fn print_announced(members: usize, acknowledged: usize) {
    if members > 0 {
        println!("announced to {acknowledged} of {members} other nodes (they serve with it now)");
    }
}
