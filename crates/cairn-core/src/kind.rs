use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::InputError;

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored, snake_case name.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = InputError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(InputError::UnknownName {
                        what: stringify!($name),
                        value: other.chars().take(64).collect(),
                    }),
                }
            }
        }
    };
}

text_enum!(
    /// What a memory is, following memharness's memory types.
    MemoryKind {
        /// A turn of a conversation.
        Conversational => "conversational",
        /// A fact or document passage.
        Knowledge => "knowledge",
        /// Something known about a person, place or thing.
        Entity => "entity",
        /// A procedure that worked.
        Workflow => "workflow",
        /// A tool description.
        Toolbox => "toolbox",
        /// A summary over other memories.
        Summary => "summary",
        /// A record of a tool call or its result.
        ToolLog => "tool_log",
        /// A file or a part of one.
        File => "file",
        /// Who the agent is or how it speaks.
        Persona => "persona",
    }
);

text_enum!(
    /// Who produced a conversational memory.
    Role {
        /// The system prompt.
        System => "system",
        /// The human user.
        User => "user",
        /// The model.
        Assistant => "assistant",
        /// A tool result.
        Tool => "tool",
    }
);

text_enum!(
    /// What a summary summarizes.
    SummaryType {
        /// Turns of a conversation.
        Conversation => "conversation",
        /// Parts of a document.
        Document => "document",
        /// A session (for example a day) of activity.
        Session => "session",
        /// Memories about one topic.
        Topic => "topic",
        /// Summaries rolled up a level (consolidation above level 1).
        Rollup => "rollup",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in MemoryKind::ALL {
            assert_eq!(k.as_str().parse::<MemoryKind>().unwrap(), *k);
            assert_eq!(
                serde_json::to_string(k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), *r);
        }
        for t in SummaryType::ALL {
            assert_eq!(t.as_str().parse::<SummaryType>().unwrap(), *t);
        }
        assert!(matches!(
            "bogus".parse::<MemoryKind>(),
            Err(InputError::UnknownName { .. })
        ));
        assert_eq!(MemoryKind::ALL.len(), 9);
    }
}
