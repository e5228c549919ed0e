//! `kumo template`: VM images and the user SSH logs in as.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::TemplateCreate;

use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// Add a VM image (platform admins).
    Create {
        /// The template's name, as `kumo vm create --template` takes it.
        name: String,
        /// Base qcow2 image path on the hosts.
        #[arg(long)]
        image: String,
        /// The operating system, e.g. ubuntu-24.04.
        #[arg(long)]
        os: String,
        /// The user SSH logs in as (`kumo vm ssh` uses it).
        #[arg(long)]
        default_user: String,
        /// Boot this kernel directly instead of the disk's boot loader.
        #[arg(long)]
        kernel: Option<String>,
        /// The initrd for --kernel (a path on the hosts).
        #[arg(long, requires = "kernel")]
        initrd: Option<String>,
        /// The kernel command line for --kernel.
        #[arg(long, requires = "kernel")]
        cmdline: Option<String>,
    },
    /// The VM images, with their OS and login user.
    List,
}

pub async fn template(
    cmd: &TemplateCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let table = |ts: &[kumo_api_types::Template]| {
        let mut t = Table::new(&["name", "os", "user", "image"]);
        for x in ts {
            t.row(vec![
                x.name.clone(),
                x.os.clone(),
                x.default_user.clone(),
                x.image_path.clone().unwrap_or_default(),
            ]);
        }
        t.render()
    };
    match cmd {
        TemplateCmd::Create {
            name,
            image,
            os,
            default_user,
            kernel,
            initrd,
            cmdline,
        } => {
            let t = c
                .create_template(&TemplateCreate {
                    name: name.clone(),
                    image_path: image.clone(),
                    os: os.clone(),
                    default_user: default_user.clone(),
                    kernel_path: kernel.clone(),
                    initrd_path: initrd.clone(),
                    kernel_cmdline: cmdline.clone(),
                })
                .await?;
            print_one(out, fmt, &t, || table(std::slice::from_ref(&t)))?;
        }
        TemplateCmd::List => {
            let ts = c.list_templates().await?;
            print_one(out, fmt, &ts, || table(&ts))?;
        }
    }
    Ok(())
}
