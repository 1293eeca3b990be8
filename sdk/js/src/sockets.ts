// The actor's open WebSockets. The host opens a socket when a client upgrades
// on the actor's path (the actor's fetch is not called), names it with an id
// (a bigint: ids are opaque and exact), and delivers its messages to the
// actor's `message` handler and its end to `close`.

import { SocketError, errorText } from './errors.js';
import { describe, isBytes } from './util.js';
import type { SocketsHost, WitMessage } from './wit-types.js';

/** A socket's id, as the host assigns it. */
export type SocketId = bigint;

/** A WebSocket message: text, or binary as bytes. */
export type Message = string | Uint8Array;

/** The WIT message for text or bytes. */
export function toWitMessage(message: Message): WitMessage {
  if (typeof message === 'string') return { tag: 'text', val: message };
  if (isBytes(message)) return { tag: 'binary', val: message };
  throw new TypeError(`a socket message is a string or a Uint8Array, not ${describe(message)}`);
}

/** Text or bytes for the WIT message. */
export function fromWitMessage(message: WitMessage): Message {
  return message.val;
}

export interface Sockets {
  /** Sends one message (text or bytes); a SocketError when the socket is gone. */
  send(socket: SocketId, message: Message): void;
  /** Closes a socket (code 1000 or 3000-4999, a reason of at most 123 bytes). */
  close(socket: SocketId, code?: number, reason?: string): void;
  /** The ids of the sockets open now. */
  list(): SocketId[];
  /** Attaches a small tag (at most 256 bytes), e.g. the user's name. */
  setTag(socket: SocketId, tag: string): void;
  /** The socket's tag, if it has one. */
  tag(socket: SocketId): string | undefined;
  /**
   * Sends `message` to every open socket (but `except`; only those whose tag
   * is `tag` when given); returns how many accepted it. A socket that closes
   * meanwhile is skipped, not an error.
   */
  broadcast(message: Message, options?: { except?: SocketId; tag?: string }): number;
}

export function createSockets(host: SocketsHost): Sockets {
  const guard = <T>(socket: SocketId, f: () => T): T => {
    try {
      return f();
    } catch (err) {
      throw new SocketError(socket, errorText(err));
    }
  };
  return {
    send(socket, message) {
      const wit = toWitMessage(message);
      guard(socket, () => host.send(socket, wit));
    },
    close(socket, code = 1000, reason = '') {
      guard(socket, () => host.close(socket, code, reason));
    },
    list() {
      return Array.from(host.list());
    },
    setTag(socket, tag) {
      guard(socket, () => host.setTag(socket, tag));
    },
    tag(socket) {
      return host.getTag(socket);
    },
    broadcast(message, options = {}) {
      const wit = toWitMessage(message);
      let sent = 0;
      for (const socket of Array.from(host.list())) {
        if (options.except !== undefined && socket === options.except) continue;
        if (options.tag !== undefined && host.getTag(socket) !== options.tag) continue;
        try {
          host.send(socket, wit);
          sent++;
        } catch {
          // Closed meanwhile: its close event follows.
        }
      }
      return sent;
    },
  };
}
